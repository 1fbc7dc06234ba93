// Fused CPU optimizer kernels for the FullOffload strategy.
//
// Every kernel makes one pass over a range of parameters: it reads the gradient (bf16 or fp32),
// multiplies it by `grad_scale`, updates the FP32 master weights and (for AdamW) the two moments in
// place, and writes the bf16 copy of the new weights into `weight_bf16_out` (the pinned upload
// buffer) when that pointer is not null.
//
// The kernels are single-threaded; run them over a ThreadPool (see thread_pool.hpp and the
// parallel_* helpers below) to use several cores. The instruction set is chosen once at run time
// (AVX-512, AVX2+FMA or portable scalar code); all three paths give bit-identical results, because
// they perform the same IEEE operations in the same order (sqrt and division are correctly rounded,
// fused multiply-adds are explicit).
#pragma once

#include <cstdint>
#include <string_view>

#include "optim/cpu/thread_pool.hpp"

namespace primecfg::train::cpu {

// One AdamW step, as torch.optim.AdamW (decoupled weight decay, bias correction):
//   g  = grad * grad_scale
//   p  = p * (1 - lr * weight_decay)
//   m  = m + (1 - beta1) * (g - m)
//   v  = beta2 * v + (1 - beta2) * g * g
//   p  = p - lr / (1 - beta1^step) * m / (sqrt(v) / sqrt(1 - beta2^step) + eps)
// `step` is 1-based (the value of the step counter after incrementing it, as in torch).
// `grad_scale` multiplies the gradient (pass 1 / loss_scale or 1 / accumulation steps); 1 = none.
struct AdamWStep {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
  std::int64_t step = 1;
  float grad_scale = 1.0f;
};

// One SignSGD step with decoupled weight decay:
//   p = p * (1 - lr * weight_decay) - lr * sign(grad * grad_scale),  sign(0) = 0, sign(NaN) = NaN
struct SignSGDStep {
  float lr = 1e-3f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
};

// Instruction-set paths. avx512 needs AVX512F+BW+VL, avx2 needs AVX2+FMA.
enum class Isa : int { scalar = 0, avx2 = 1, avx512 = 2 };

const char* to_string(Isa isa) noexcept;
// Parses "scalar", "avx2", "avx512" (case-insensitive); returns false on anything else.
bool parse_isa(std::string_view text, Isa& out) noexcept;
// Whether this CPU (and OS) can run `isa`.
bool isa_supported(Isa isa) noexcept;
// The best path this CPU supports.
Isa best_isa() noexcept;
// The path the overloads without an Isa argument use: best_isa(), or what set_active_isa() chose
// (primecfg-train's --offload.cpu-isa).
Isa active_isa() noexcept;
// Selects the default path; returns false (and changes nothing) when the CPU cannot run `isa`.
bool set_active_isa(Isa isa) noexcept;

// Ranges of at least this many elements write the bf16 output with streaming (non-temporal) stores,
// which skip reading the destination into the cache. Default 32768 (the benchmark's --stream-min
// sets it); 0 = always, a negative value = never.
void set_streaming_store_threshold(std::int64_t elements) noexcept;
std::int64_t streaming_store_threshold() noexcept;

// How far ahead (in elements) the AVX-512 kernels prefetch their input streams with software
// prefetches, on top of what the hardware prefetcher does (which alone left SignSGD at three
// quarters of the machine's bandwidth). Default 1024 (the benchmark's --prefetch sets it); 0 = none,
// negative values count as 0. Results do not depend on it.
void set_prefetch_distance(std::int64_t elements) noexcept;
std::int64_t prefetch_distance() noexcept;

// Bytes of memory traffic per parameter, as counted by the benchmark (reads + writes, no
// write-allocate): AdamW with bf16 grad and bf16 output = 4*3 read + 2 + 4*3 written + 2 = 28.
constexpr double adamw_bytes_per_param(bool bf16_grad, bool bf16_out) {
  return 24.0 + (bf16_grad ? 2.0 : 4.0) + (bf16_out ? 2.0 : 0.0);
}
constexpr double sign_sgd_bytes_per_param(bool bf16_grad, bool bf16_out) {
  return 8.0 + (bf16_grad ? 2.0 : 4.0) + (bf16_out ? 2.0 : 0.0);
}

// --- Single-threaded kernels over one range, default path ------------------------------------------
// `weight_bf16_out` may be nullptr (no bf16 copy written). n <= 0 does nothing. Buffers must not
// overlap each other. No alignment is required; a 64-byte aligned `weight_bf16_out` is written with
// streaming stores.
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const std::uint16_t* grad_bf16,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step);
void adamw(float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step);
void sign_sgd(float* master, const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& step);
void sign_sgd(float* master, const float* grad, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& step);

// --- The same with an explicit path (tests, benchmarks). Throws std::invalid_argument when the CPU
// cannot run `isa`.
void adamw(Isa isa, float* master, float* exp_avg, float* exp_avg_sq, const std::uint16_t* grad_bf16,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step);
void adamw(Isa isa, float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
           std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step);
void sign_sgd(Isa isa, float* master, const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out,
              std::int64_t n, const SignSGDStep& step);
void sign_sgd(Isa isa, float* master, const float* grad, std::uint16_t* weight_bf16_out, std::int64_t n,
              const SignSGDStep& step);

// --- Multithreaded: split [0, n) over `pool` in pieces that are multiples of `grain` elements
// (a multiple of 32 keeps every piece's bf16 output 64-byte aligned when the buffer is).
inline constexpr std::int64_t kDefaultGrain = 16384;
void parallel_adamw(ThreadPool& pool, float* master, float* exp_avg, float* exp_avg_sq,
                    const std::uint16_t* grad_bf16, std::uint16_t* weight_bf16_out, std::int64_t n,
                    const AdamWStep& step, std::int64_t grain = kDefaultGrain);
void parallel_adamw(ThreadPool& pool, float* master, float* exp_avg, float* exp_avg_sq, const float* grad,
                    std::uint16_t* weight_bf16_out, std::int64_t n, const AdamWStep& step,
                    std::int64_t grain = kDefaultGrain);
void parallel_sign_sgd(ThreadPool& pool, float* master, const std::uint16_t* grad_bf16,
                       std::uint16_t* weight_bf16_out, std::int64_t n, const SignSGDStep& step,
                       std::int64_t grain = kDefaultGrain);
void parallel_sign_sgd(ThreadPool& pool, float* master, const float* grad, std::uint16_t* weight_bf16_out,
                       std::int64_t n, const SignSGDStep& step, std::int64_t grain = kDefaultGrain);

// --- bf16 helpers (round-to-nearest-even, NaN -> 0x7FC0, exactly as c10::BFloat16) ----------------
std::uint16_t float_to_bf16(float value) noexcept;
float bf16_to_float(std::uint16_t bits) noexcept;
// Whole-array conversions on the active path (used by tests, benchmarks and checkpoint code).
void float_to_bf16(const float* in, std::uint16_t* out, std::int64_t n) noexcept;
void bf16_to_float(const std::uint16_t* in, float* out, std::int64_t n) noexcept;

}  // namespace primecfg::train::cpu
