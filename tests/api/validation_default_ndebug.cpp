// One of the two translation units of test_validation_default.cpp (validation_default_tu.hpp).
#ifndef NDEBUG
#error "this file must be compiled with NDEBUG (tests/api/CMakeLists.txt)"
#endif
#include <cstddef>
#include <cstdint>
#include <vector>

#include "decodegraph/executor.hpp"
#include "validation_default_tu.hpp"

namespace dgtest {

ValidationSeen validation_seen_with_ndebug() {
  namespace dg = decodegraph;
  ValidationSeen s{};
  s.constant = dg::kDefaultValidation;
  dg::ExecutorConfig c{};  // aggregate initialisation: the default member initialisers of this file
  s.field = c.validation;
  // A tiny host-backend executor configured here: what the library resolves from this file's config.
  c.spec = {4, 2, 64, 16, dg::DType::kFloat16, dg::KVLayout::kNHD};
  c.backend = dg::BackendKind::kHost;
  c.max_batch = 1;
  c.max_seq_len = 64;
  c.num_blocks = 4;
  const std::size_t bytes = static_cast<std::size_t>(c.num_blocks) * c.spec.block_elems() * 2;
  std::vector<unsigned char> k(bytes + 64), v(bytes + 64);
  dg::LayerBuffers lb;
  lb.k_cache = k.data() + (64 - reinterpret_cast<std::uintptr_t>(k.data()) % 64) % 64;
  lb.v_cache = v.data() + (64 - reinterpret_cast<std::uintptr_t>(v.data()) % 64) % 64;
  lb.k_cache_bytes = lb.v_cache_bytes = bytes;
  c.layers = {lb};
  s.resolved = dg::Executor(c).config().validation;
#ifdef NDEBUG
  s.ndebug = true;
#else
  s.ndebug = false;
#endif
  return s;
}

}  // namespace dgtest
