"""Printing (rich) and drawing (matplotlib) the results; the library never prints."""
