"""Inference placement: notebook 05's paper profile must use the GPU when there is one and say what it
uses. The decisions are checked with the CUDA probes replaced; the move itself on CPU here and on CUDA where present."""
import os

import pytest
import torch
from torch import nn

from moelab import device


def test_gpu_when_there_is_one_else_all_cpu_threads():
    assert device.inference_placement(cuda_available=True, bf16_supported=True).dtype == torch.bfloat16
    gpu = device.inference_placement(cuda_available=True, bf16_supported=False)
    assert gpu.device == "cuda:0" and gpu.dtype == torch.float16 and "cuda:0" in gpu.describe()
    cpu = device.inference_placement(cuda_available=False)
    assert cpu.device == "cpu" and cpu.dtype == torch.float32 and cpu.threads >= 1
    assert "torch.float32" in cpu.describe()


def _loader(path, dtype=torch.float32):
    return nn.Linear(3, 2).to(dtype), f"tok:{path}"


def test_load_for_inference_places_and_says_where(monkeypatch):
    said = []
    threads = torch.get_num_threads()
    try:
        model, tok = device.load_for_inference(_loader, "/m", device="cpu", log=said.append)
    finally:
        torch.set_num_threads(threads)
    assert tok == "tok:/m" and next(model.parameters()).device.type == "cpu"
    assert said and said[0].startswith("model on cpu in torch.float32")


@pytest.mark.cuda
def test_load_for_inference_on_cuda():
    said = []
    model, _ = device.load_for_inference(_loader, "/m", log=said.append)
    p = next(model.parameters())
    assert p.device.type == "cuda" and p.dtype in (torch.bfloat16, torch.float16) and "cuda:0" in said[0]


def test_cpu_placement_respects_a_lanes_thread_pin(monkeypatch):
    """A runner lane (issue 49) pins its kernel to OMP_NUM_THREADS=1: inference placement must not widen it to every
    core (it did: 05's paper path ran two lanes on four threads)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert device.inference_placement(cuda_available=False).threads == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert device.inference_placement(cuda_available=False).threads == (os.cpu_count() or 1)
    monkeypatch.setenv("OMP_NUM_THREADS", "two")
    with pytest.raises(ValueError, match="OMP_NUM_THREADS='two'"):
        device.cpu_threads()
