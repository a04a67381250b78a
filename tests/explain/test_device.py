"""The explanations honour the model's device: every tensor they create is made where the model's
weights are.

On a machine with only a CPU every device is the CPU, so a test that compared devices would pass
whatever the code did. What can be checked anywhere is the cause: a tensor made by a factory
(``torch.tensor``, ``arange``, ``zeros`` …) without ``device=`` lands on the default device
whatever the model's is. A ``TorchFunctionMode`` records every factory call made during an
explanation; none made by qkv's explanation code may leave the device out (tensors made with
``*_like``/``new_*`` or by an operation on another tensor follow their inputs). With CUDA lent,
the second test runs the same explanations on the GPU and compares them with the CPU's.
"""

import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

import qkv
from qkv.explain import attention_map, attention_maps, explain_head, score_attribution

FACTORIES = {torch.tensor, torch.as_tensor, torch.arange, torch.zeros, torch.ones, torch.empty,
             torch.full, torch.randn, torch.rand, torch.eye, torch.linspace, torch.randint,
             torch.empty_strided, torch.scalar_tensor}
TEXT = "baka bela dima fona baka bela dima fona"


class FactoryCalls(TorchFunctionMode):
    """Records ``file:line`` of each factory call that gives no device (the first frame outside
    torch), except ``torch.tensor``/``as_tensor`` of a tensor (which keeps its device)."""

    def __init__(self):
        super().__init__()
        self.without_device: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        copies = func in (torch.tensor, torch.as_tensor) and args and isinstance(args[0], torch.Tensor)
        if func in FACTORIES and kwargs.get("device") is None and not copies:
            frame = sys._getframe(1)
            while frame is not None and "/torch/" in frame.f_code.co_filename:
                frame = frame.f_back
            where = frame.f_code.co_filename.replace("\\", "/").split("/src/")[-1]
            self.without_device.append(f"{func.__name__} at {where}:{frame.f_lineno}")
        return func(*args, **kwargs)


def explanations(model):
    return [attention_map(model, TEXT, layer=1, head=0), attention_maps(model, TEXT, layer=0),
            attention_maps(model, TEXT), explain_head(model, TEXT, layer=1, head=0, token=7),
            score_attribution(model, TEXT, layer=1, head=0, token=7, key=4)]


def test_every_tensor_an_explanation_makes_is_made_on_the_models_device():
    model = qkv.load("lm")
    with FactoryCalls() as calls:
        explanations(model)
    ours = [c for c in calls.without_device if "qkv/explain/" in c]
    assert ours == [], ours


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_same_explanations_on_cuda_as_on_the_cpu():
    cpu, gpu = qkv.load("lm"), qkv.load("lm", device="cuda")
    for a, b in zip(explanations(cpu), explanations(gpu)):
        for name in ("weights", "terms"):
            x, y = getattr(a, name, None), getattr(b, name, None)
            if isinstance(x, torch.Tensor):
                assert y.device.type == "cuda"
                # float32 kernels on two devices: a few roundings of each weight apart
                torch.testing.assert_close(y.cpu(), x, atol=1e-5, rtol=1e-4)
