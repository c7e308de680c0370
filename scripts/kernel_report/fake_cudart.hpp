// Interface between fake_cudart.cpp (records launches) and probe.cpp (knows the launchers).
#pragma once

#include <cstddef>

struct FakeLaunch {
  const char* kernel = nullptr;  // mangled device name; null if the stub was never registered
  unsigned grid[3] = {0, 0, 0};
  unsigned block[3] = {0, 0, 0};
  std::size_t dynamic_smem = 0;
  void** args = nullptr;  // the kernel's arguments, valid only during the callback
};

/// Defined by the probe: called for every launch, while `args` is alive.
void fake_cudart_on_launch(const FakeLaunch& launch);
/// Defined by the probe: cudaFuncSetAttribute(MaxDynamicSharedMemorySize) on a kernel.
void fake_cudart_on_smem_optin(const char* kernel, int bytes);
