"""kernels/gpu.py: every CUDA C source of kernels/ compiles with NVRTC for sm_80 and sm_90 (no GPU needed), a
planted error comes back with its line, and the oldest GPU the raw kernels claim follows NVRTC."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import kernels
from kernels import gpu

pytestmark = pytest.mark.serial  # no MPI: the serial pass runs it


def nvrtc_or_skip():
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:  # CuPy missing, or its NVRTC library
        pytest.skip(f"NVRTC is not available ({type(exc).__name__}: {exc}): pip install -e '.[test]' "
                    f"(cupy-cuda12x and nvidia-cuda-nvrtc-cu12)")
    return nvrtc


def sources() -> list[tuple[str, str, tuple[str, ...]]]:
    """(module, CUDA_SOURCE, CUDA_KERNELS) of every module of kernels/ that holds CUDA C."""
    found = []
    for info in pkgutil.iter_modules(kernels.__path__):
        module = importlib.import_module(f"kernels.{info.name}")
        if hasattr(module, "CUDA_SOURCE"):
            assert hasattr(module, "CUDA_KERNELS"), f"kernels/{info.name}.py has CUDA_SOURCE but no CUDA_KERNELS"
            found.append((info.name, module.CUDA_SOURCE, module.CUDA_KERNELS))
    return found


def test_the_sources_are_found():
    assert {name for name, _, _ in sources()} >= {"heat", "star"}


@pytest.mark.parametrize("arch", gpu.ARCHITECTURES)
def test_every_cuda_source_compiles_with_nvrtc(arch):
    nvrtc_or_skip()
    for name, source, names in sources():
        cubin = gpu.compile_source(source, names, arch)
        assert cubin[:4] == b"\x7fELF", f"kernels/{name}.py for {arch}: not a cubin"


def test_a_compile_error_names_its_line():
    nvrtc_or_skip()
    from kernels import heat

    broken = heat.CUDA_SOURCE.replace("const T s = ((u[p - nx]", "const T s = ((u[p - nx_typo]", 1)
    line = broken[:broken.index("nx_typo")].count("\n") + 1
    with pytest.raises(RuntimeError, match=rf"cannot compile the kernels heat2d, heat3d for sm_90:[\s\S]*kernels\.cu"
                                           rf"\({line}\): error: identifier \"nx_typo\" is undefined"):
        gpu.compile_source(broken, heat.CUDA_KERNELS, "sm_90")


def test_minimum_capability_follows_nvrtc():
    assert gpu.minimum_capability([50, 52, 60, 70, 75, 80, 90]) == 60  # NVRTC 12: the kernels' own limit
    assert gpu.minimum_capability([75, 80, 86, 89, 90, 100]) == 75  # NVRTC 13 refuses compute_60
    assert gpu.minimum_capability([]) == 60


def test_the_installed_nvrtc_compiles_for_the_claimed_minimum():
    nvrtc = nvrtc_or_skip()
    need = gpu.minimum_capability(list(nvrtc.getSupportedArchs()))
    from kernels import star

    assert gpu.compile_source(star.CUDA_SOURCE, star.CUDA_KERNELS, f"sm_{need}")[:4] == b"\x7fELF"
