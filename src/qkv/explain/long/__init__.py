"""Long texts at O(N): a document's record and what is read from it."""
