// Signatures of the torch.ops.sonicmoe implementations (csrc/torch/*.cpp).
#pragma once

#include <ATen/core/Tensor.h>

namespace sonicmoe::torch_ops {

// grouped_gemm(Tensor a, Tensor b, Tensor expert_offsets, int tile_config=0) -> Tensor
at::Tensor grouped_gemm_cuda(const at::Tensor& a, const at::Tensor& b,
                             const at::Tensor& expert_offsets, int64_t tile_config);
// CPU tensors: the same argument checks, then an error (the kernels are CUDA-only).
at::Tensor grouped_gemm_cpu(const at::Tensor& a, const at::Tensor& b,
                            const at::Tensor& expert_offsets, int64_t tile_config);

// combine(Tensor y, Tensor scores, Tensor rev_idx) -> Tensor
at::Tensor combine_cuda(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx);
at::Tensor combine_cpu(const at::Tensor& y, const at::Tensor& scores, const at::Tensor& rev_idx);

}  // namespace sonicmoe::torch_ops
