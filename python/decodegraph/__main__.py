"""``python -m decodegraph``: says what this build is (CUDA or host only) and whether a GPU is present."""

from __future__ import annotations

from . import build_info


def main() -> None:
    info = build_info()
    if info["cuda"]:
        kind = f"CUDA {info['cuda_compiler_version']} (architectures {info['cuda_architectures']})"
    else:
        kind = "host only (built without CUDA: no nvcc found, or DECODEGRAPH_ENABLE_CUDA=OFF)"
    device = "a CUDA device is present" if info["cuda_device_available"] else "no usable CUDA device"
    backend = "cuda" if info["cuda_device_available"] else "host"
    print(f"decodegraph {info['version']}: {kind}; {device}; backend='auto' picks {backend}")


if __name__ == "__main__":
    main()
