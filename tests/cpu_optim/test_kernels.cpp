// Kernel tests that need no LibTorch: SignSGD bit-exact against an independent scalar reference,
// AdamW against a double-precision reference, every instruction-set path this CPU has, odd sizes,
// unaligned buffers, zero gradients and the gradient scale.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "optim/cpu/cpu_optim.hpp"

namespace cpu = primecfg::train::cpu;

namespace {

// 64-byte aligned storage, so tests control the alignment of every buffer exactly.
template <class T>
struct Buffer {
  explicit Buffer(std::size_t n, std::size_t offset = 0) : offset_(offset) {
    const std::size_t bytes = ((n + offset) * sizeof(T) + 63) / 64 * 64 + 64;
    base_ = static_cast<T*>(std::aligned_alloc(64, bytes));
    std::memset(base_, 0, bytes);
  }
  ~Buffer() { std::free(base_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  T* data() { return base_ + offset_; }
  T& operator[](std::size_t i) { return base_[offset_ + i]; }
  std::size_t offset_;
  T* base_;
};

std::uint32_t bits_of(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Independent reference conversions (written from the definition of round-to-nearest-even).
std::uint16_t ref_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const std::uint32_t u = bits_of(f);
  const std::uint32_t upper = u >> 16;
  const std::uint32_t lower = u & 0xFFFFu;
  std::uint32_t r = upper;
  if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u) != 0)) r = upper + 1;
  return static_cast<std::uint16_t>(r);
}
float ref_from_bf16(std::uint16_t b) { return from_bits(std::uint32_t{b} << 16); }

std::vector<cpu::Isa> supported_isas() {
  std::vector<cpu::Isa> out;
  for (cpu::Isa isa : {cpu::Isa::scalar, cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (cpu::isa_supported(isa)) out.push_back(isa);
  }
  return out;
}

// Gradients of mixed magnitudes and signs, some exact zeros, as bf16 and as fp32.
void fill_grads(std::mt19937& rng, std::int64_t n, std::uint16_t* g16, float* g32,
                double zero_fraction = 0.05) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> expo(-6.0f, 2.0f);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  for (std::int64_t i = 0; i < n; ++i) {
    float g = normal(rng) * std::pow(10.0f, expo(rng));
    if (u01(rng) < zero_fraction) g = (i & 1) ? 0.0f : -0.0f;
    const std::uint16_t b = ref_to_bf16(g);
    if (g16 != nullptr) g16[i] = b;
    if (g32 != nullptr) g32[i] = g;
  }
}

void fill_state(std::mt19937& rng, std::int64_t n, float* p, float* m, float* v) {
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::uniform_real_distribution<float> pos(0.0f, 1e-3f);
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = normal(rng);
    if (m != nullptr) m[i] = normal(rng) * 1e-2f;
    if (v != nullptr) v[i] = pos(rng) * pos(rng);
  }
}

// SignSGD reference, from its definition; float arithmetic, one rounding per operation.
float ref_sign_sgd(float p, float g, const cpu::SignSGDStep& s) {
  const float decay =
      static_cast<float>(1.0 - static_cast<double>(s.lr) * static_cast<double>(s.weight_decay));
  const volatile float scaled = g * s.grad_scale;  // volatile: no fused multiply-add here
  float sign = 0.0f;
  if (std::isnan(scaled))
    sign = scaled;
  else if (scaled > 0.0f)
    sign = 1.0f;
  else if (scaled < 0.0f)
    sign = -1.0f;
  const volatile float shrunk = p * decay;
  const volatile float delta = s.lr * sign;
  return shrunk - delta;
}

struct AdamRef {
  double p, m, v, denom, step_size;
};
AdamRef ref_adamw(float p, float m, float v, float g, const cpu::AdamWStep& s) {
  const double b1 = s.beta1, b2 = s.beta2, lr = s.lr;
  const double gd = static_cast<double>(g) * static_cast<double>(s.grad_scale);
  AdamRef r;
  r.p = static_cast<double>(p) * (1.0 - lr * static_cast<double>(s.weight_decay));
  r.m = b1 * m + (1.0 - b1) * gd;
  r.v = b2 * v + (1.0 - b2) * gd * gd;
  const double bc1 = 1.0 - std::pow(b1, static_cast<double>(s.step));
  const double bc2 = 1.0 - std::pow(b2, static_cast<double>(s.step));
  r.denom = std::sqrt(r.v) / std::sqrt(bc2) + static_cast<double>(s.eps);
  r.step_size = lr / bc1;
  r.p -= r.step_size * r.m / r.denom;
  return r;
}

const std::int64_t kSizes[] = {0, 1, 2, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 1000, 4099, 1000003};

void check_bf16_out(const float* p, const std::uint16_t* out, std::int64_t n) {
  std::int64_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) bad += out[i] != ref_to_bf16(p[i]);
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("bf16 conversion rounds to nearest even like c10::BFloat16") {
  CHECK(cpu::float_to_bf16(1.0f) == 0x3F80);
  CHECK(cpu::float_to_bf16(from_bits(0x3F808000u)) == 0x3F80);  // tie, even stays
  CHECK(cpu::float_to_bf16(from_bits(0x3F818000u)) == 0x3F82);  // tie, odd rounds up
  CHECK(cpu::float_to_bf16(from_bits(0x3F808001u)) == 0x3F81);
  CHECK(cpu::float_to_bf16(from_bits(0x3F807FFFu)) == 0x3F80);
  CHECK(cpu::float_to_bf16(std::numeric_limits<float>::infinity()) == 0x7F80);
  CHECK(cpu::float_to_bf16(-std::numeric_limits<float>::infinity()) == 0xFF80);
  CHECK(cpu::float_to_bf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds up to inf
  CHECK(cpu::float_to_bf16(std::numeric_limits<float>::quiet_NaN()) == 0x7FC0);
  CHECK(cpu::float_to_bf16(from_bits(0xFFC12345u)) == 0x7FC0);  // negative NaN with payload
  CHECK(cpu::float_to_bf16(from_bits(0x00018000u)) == 0x0002);  // denormal, tie to even
  CHECK(cpu::float_to_bf16(-0.0f) == 0x8000);
  CHECK(cpu::bf16_to_float(0x3F80) == 1.0f);
  CHECK(std::isnan(cpu::bf16_to_float(0x7FC0)));

  // Every path converts arrays exactly like the reference, for random bit patterns.
  std::mt19937 rng(7);
  const std::int64_t n = 100003;
  std::vector<float> in(static_cast<std::size_t>(n));
  for (auto& f : in) f = from_bits(static_cast<std::uint32_t>(rng()));
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    REQUIRE(cpu::set_active_isa(isa));
    std::vector<std::uint16_t> out(static_cast<std::size_t>(n));
    cpu::float_to_bf16(in.data(), out.data(), n);
    std::int64_t bad = 0;
    for (std::int64_t i = 0; i < n; ++i)
      bad += out[static_cast<std::size_t>(i)] != ref_to_bf16(in[static_cast<std::size_t>(i)]);
    CHECK(bad == 0);
    std::vector<float> back(static_cast<std::size_t>(n));
    cpu::bf16_to_float(out.data(), back.data(), n);
    for (std::int64_t i = 0; i < 1000; ++i) {
      CHECK(bits_of(back[static_cast<std::size_t>(i)]) ==
            bits_of(ref_from_bf16(out[static_cast<std::size_t>(i)])));
    }
  }
  cpu::set_active_isa(cpu::best_isa());
}

TEST_CASE("ISA selection") {
  CHECK(cpu::isa_supported(cpu::Isa::scalar));
  CHECK(cpu::isa_supported(cpu::best_isa()));
  cpu::Isa parsed;
  CHECK(cpu::parse_isa("AVX512", parsed));
  CHECK(parsed == cpu::Isa::avx512);
  CHECK(cpu::parse_isa("scalar", parsed));
  CHECK(parsed == cpu::Isa::scalar);
  CHECK_FALSE(cpu::parse_isa("sse9", parsed));
  CHECK(cpu::set_active_isa(cpu::Isa::scalar));
  CHECK(cpu::active_isa() == cpu::Isa::scalar);
  for (cpu::Isa isa : {cpu::Isa::avx2, cpu::Isa::avx512}) {
    if (!cpu::isa_supported(isa)) {
      CHECK_FALSE(cpu::set_active_isa(isa));
      float p = 0, m = 0, v = 0, g = 0;
      CHECK_THROWS_AS(cpu::adamw(isa, &p, &m, &v, &g, nullptr, 1, cpu::AdamWStep{}), std::invalid_argument);
    }
  }
  CHECK(cpu::set_active_isa(cpu::best_isa()));
  MESSAGE("best ISA on this machine: " << std::string(cpu::to_string(cpu::best_isa())));
}

TEST_CASE("SignSGD is bit-exact against the scalar reference on every path") {
  const cpu::SignSGDStep steps[] = {
      {1e-3f, 0.0f, 1.0f}, {3e-4f, 0.1f, 1.0f}, {1e-2f, 0.01f, 0.25f}, {5e-3f, 0.0f, -2.0f}};
  std::mt19937 rng(11);
  for (cpu::Isa isa : supported_isas()) {
    for (std::int64_t n : kSizes) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool bf16_grad = (variant & 1) != 0;
        const bool with_out = (variant & 2) != 0;
        const std::size_t offset = static_cast<std::size_t>(n % 7);  // misaligned buffers too
        const cpu::SignSGDStep& s = steps[(n + variant) % 4];
        const std::string isa_name = cpu::to_string(isa);
        CAPTURE(isa_name);
        CAPTURE(n);
        CAPTURE(variant);
        Buffer<float> p(static_cast<std::size_t>(n), offset), g32(static_cast<std::size_t>(n), offset + 1);
        Buffer<std::uint16_t> g16(static_cast<std::size_t>(n), offset + 3),
            out(static_cast<std::size_t>(n), offset);
        fill_state(rng, n, p.data(), nullptr, nullptr);
        fill_grads(rng, n, g16.data(), g32.data(), 0.2);
        std::vector<float> expect(static_cast<std::size_t>(n));
        for (std::int64_t i = 0; i < n; ++i) {
          const float g =
              bf16_grad ? ref_from_bf16(g16[static_cast<std::size_t>(i)]) : g32[static_cast<std::size_t>(i)];
          expect[static_cast<std::size_t>(i)] = ref_sign_sgd(p[static_cast<std::size_t>(i)], g, s);
        }
        std::uint16_t* o = with_out ? out.data() : nullptr;
        if (bf16_grad)
          cpu::sign_sgd(isa, p.data(), g16.data(), o, n, s);
        else
          cpu::sign_sgd(isa, p.data(), g32.data(), o, n, s);
        std::int64_t bad = 0;
        for (std::int64_t i = 0; i < n; ++i) {
          bad += bits_of(p[static_cast<std::size_t>(i)]) != bits_of(expect[static_cast<std::size_t>(i)]);
        }
        CHECK(bad == 0);
        if (with_out) check_bf16_out(p.data(), out.data(), n);
      }
    }
  }
}

TEST_CASE("SignSGD edge values: zero, NaN and infinite gradients") {
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> g = {0.0f, -0.0f, nan, inf, -inf, 1e-30f, -1e-30f, 3.0f};
    g.resize(40, 0.5f);
    std::vector<float> p(g.size(), 1.0f);
    std::vector<std::uint16_t> out(g.size());
    cpu::sign_sgd(isa, p.data(), g.data(), out.data(), static_cast<std::int64_t>(g.size()),
                  {0.5f, 0.0f, 1.0f});
    CHECK(p[0] == 1.0f);
    CHECK(p[1] == 1.0f);
    CHECK(std::isnan(p[2]));
    CHECK(out[2] == 0x7FC0);
    CHECK(p[3] == 0.5f);
    CHECK(p[4] == 1.5f);
    CHECK(p[5] == 0.5f);
    CHECK(p[6] == 1.5f);
    CHECK(p[39] == 0.5f);
  }
}

TEST_CASE("AdamW matches a double-precision reference on every path") {
  std::mt19937 rng(5);
  const cpu::AdamWStep base{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 1, 1.0f};
  for (cpu::Isa isa : supported_isas()) {
    for (std::int64_t n : kSizes) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool bf16_grad = (variant & 1) != 0;
        const bool with_out = (variant & 2) != 0;
        const std::string isa_name = cpu::to_string(isa);
        CAPTURE(isa_name);
        CAPTURE(n);
        CAPTURE(variant);
        const std::size_t un = static_cast<std::size_t>(n);
        const std::size_t offset = static_cast<std::size_t>((n + variant) % 5);
        Buffer<float> p(un, offset), m(un, offset + 2), v(un, offset + 1), g32(un, offset);
        Buffer<std::uint16_t> g16(un, offset + 5), out(un, offset + 9);
        fill_state(rng, n, p.data(), m.data(), v.data());
        double worst_p = 0, worst_m = 0, worst_v = 0;
        for (std::int64_t step = 1; step <= 3; ++step) {
          cpu::AdamWStep s = base;
          s.step = step == 3 ? 1000 : step;
          s.grad_scale = step == 2 ? 0.125f : 1.0f;
          s.weight_decay = variant == 3 ? 0.0f : 0.01f;
          fill_grads(rng, n, g16.data(), g32.data());
          std::vector<AdamRef> expect(un);
          for (std::size_t i = 0; i < un; ++i) {
            const float g = bf16_grad ? ref_from_bf16(g16[i]) : g32[i];
            expect[i] = ref_adamw(p[i], m[i], v[i], g, s);
          }
          std::vector<float> p0(p.data(), p.data() + un), m0(m.data(), m.data() + un),
              v0(v.data(), v.data() + un);
          std::uint16_t* o = with_out ? out.data() : nullptr;
          if (bf16_grad)
            cpu::adamw(isa, p.data(), m.data(), v.data(), g16.data(), o, n, s);
          else
            cpu::adamw(isa, p.data(), m.data(), v.data(), g32.data(), o, n, s);
          std::int64_t bad = 0;
          for (std::size_t i = 0; i < un; ++i) {
            const float g = bf16_grad ? ref_from_bf16(g16[i]) : g32[i];
            const double gd = static_cast<double>(g) * s.grad_scale;
            const double tol_m = 4e-7 * (std::fabs(m0[i]) + 0.1 * std::fabs(gd)) + 1e-37;
            const double tol_v = 4e-7 * (std::fabs(v0[i]) + 1e-3 * gd * gd) + 1e-40;
            const double decayed = static_cast<double>(p0[i]) * (1.0 - 1e-3 * s.weight_decay);
            const double update = std::fabs(expect[i].p - decayed);
            // m may cancel to almost nothing; its absolute error then carries into the update.
            const double tol_p = 3e-7 * std::fabs(p0[i]) + 2e-6 * update +
                                 expect[i].step_size * tol_m / expect[i].denom + 1e-37;
            const double dp = std::fabs(p[i] - expect[i].p), dm = std::fabs(m[i] - expect[i].m),
                         dv = std::fabs(v[i] - expect[i].v);
            worst_p = std::max(worst_p, dp / tol_p);
            worst_m = std::max(worst_m, dm / tol_m);
            worst_v = std::max(worst_v, dv / tol_v);
            bad += dp > tol_p || dm > tol_m || dv > tol_v;
          }
          CHECK(bad == 0);
          if (with_out) check_bf16_out(p.data(), out.data(), n);
        }
        CHECK(worst_p <= 1.0);
        CHECK(worst_m <= 1.0);
        CHECK(worst_v <= 1.0);
      }
    }
  }
}

TEST_CASE("AdamW: every path gives bit-identical results") {
  const std::int64_t n = 1000003;
  const std::size_t un = static_cast<std::size_t>(n);
  std::mt19937 rng(9);
  Buffer<float> p0(un), m0(un), v0(un), g32(un);
  Buffer<std::uint16_t> g16(un);
  fill_state(rng, n, p0.data(), m0.data(), v0.data());
  fill_grads(rng, n, g16.data(), g32.data());
  const cpu::AdamWStep s{2e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 7, 0.5f};
  std::vector<float> ref_p, ref_m, ref_v;
  std::vector<std::uint16_t> ref_out;
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    std::vector<float> p(p0.data(), p0.data() + un), m(m0.data(), m0.data() + un),
        v(v0.data(), v0.data() + un);
    Buffer<std::uint16_t> out(un);
    cpu::adamw(isa, p.data(), m.data(), v.data(), g16.data(), out.data(), n, s);
    if (ref_p.empty()) {  // the scalar path comes first
      ref_p = p;
      ref_m = m;
      ref_v = v;
      ref_out.assign(out.data(), out.data() + un);
      continue;
    }
    CHECK(std::memcmp(p.data(), ref_p.data(), un * 4) == 0);
    CHECK(std::memcmp(m.data(), ref_m.data(), un * 4) == 0);
    CHECK(std::memcmp(v.data(), ref_v.data(), un * 4) == 0);
    CHECK(std::memcmp(out.data(), ref_out.data(), un * 2) == 0);
  }
  // fp32 gradients equal to the bf16 ones give the same result as the bf16 path.
  for (std::size_t i = 0; i < un; ++i) g32[i] = ref_from_bf16(g16[i]);
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    std::vector<float> p(p0.data(), p0.data() + un), m(m0.data(), m0.data() + un),
        v(v0.data(), v0.data() + un);
    cpu::adamw(isa, p.data(), m.data(), v.data(), g32.data(), nullptr, n, s);
    CHECK(std::memcmp(p.data(), ref_p.data(), un * 4) == 0);
    CHECK(std::memcmp(v.data(), ref_v.data(), un * 4) == 0);
  }
}

TEST_CASE("AdamW with zero gradients only decays the weights") {
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    const std::int64_t n = 1037;
    std::vector<float> p(static_cast<std::size_t>(n)), m(static_cast<std::size_t>(n), 0.0f),
        v(static_cast<std::size_t>(n), 0.0f);
    std::vector<std::uint16_t> g(static_cast<std::size_t>(n), 0), out(static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i)
      p[static_cast<std::size_t>(i)] = 0.001f * static_cast<float>(i - 500);
    const std::vector<float> before = p;
    const cpu::AdamWStep s{1e-2f, 0.9f, 0.999f, 1e-8f, 0.1f, 1, 1.0f};
    cpu::adamw(isa, p.data(), m.data(), v.data(), g.data(), out.data(), n, s);
    const float decay = static_cast<float>(1.0 - 1e-2 * 0.1);
    for (std::size_t i = 0; i < before.size(); ++i) {
      CHECK(p[i] == before[i] * decay);
      CHECK(m[i] == 0.0f);
      CHECK(v[i] == 0.0f);
    }
    check_bf16_out(p.data(), out.data(), n);
    // Without weight decay nothing moves at all.
    const std::vector<float> again = p;
    cpu::adamw(isa, p.data(), m.data(), v.data(), g.data(), nullptr, n,
               {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f, 2, 1.0f});
    CHECK(std::memcmp(p.data(), again.data(), again.size() * 4) == 0);
  }
}

TEST_CASE("grad_scale multiplies the gradient") {
  // With a power-of-two scale, scaling inside the kernel equals feeding pre-scaled gradients.
  const std::int64_t n = 4099;
  const std::size_t un = static_cast<std::size_t>(n);
  std::mt19937 rng(3);
  std::vector<float> p0(un), m0(un), v0(un), g(un), g_scaled(un);
  fill_state(rng, n, p0.data(), m0.data(), v0.data());
  fill_grads(rng, n, nullptr, g.data());
  for (std::size_t i = 0; i < un; ++i) g_scaled[i] = g[i] * 0.25f;
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    std::vector<float> pa = p0, ma = m0, va = v0, pb = p0, mb = m0, vb = v0;
    cpu::adamw(isa, pa.data(), ma.data(), va.data(), g.data(), nullptr, n,
               {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, 0.25f});
    cpu::adamw(isa, pb.data(), mb.data(), vb.data(), g_scaled.data(), nullptr, n,
               {1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, 3, 1.0f});
    CHECK(std::memcmp(pa.data(), pb.data(), un * 4) == 0);
    CHECK(std::memcmp(ma.data(), mb.data(), un * 4) == 0);
    CHECK(std::memcmp(va.data(), vb.data(), un * 4) == 0);
    std::vector<float> sa = p0, sb = p0;
    cpu::sign_sgd(isa, sa.data(), g.data(), nullptr, n, {1e-3f, 0.0f, -1.0f});
    cpu::sign_sgd(isa, sb.data(), g.data(), nullptr, n, {-1e-3f, 0.0f, 1.0f});
    CHECK(std::memcmp(sa.data(), sb.data(), un * 4) == 0);
  }
}

TEST_CASE("default entry points follow the active path") {
  const std::int64_t n = 1000;
  std::vector<float> p(static_cast<std::size_t>(n), 1.0f), m(static_cast<std::size_t>(n), 0.0f),
      v(static_cast<std::size_t>(n), 0.0f);
  std::vector<std::uint16_t> g(static_cast<std::size_t>(n), cpu::float_to_bf16(0.5f)),
      out(static_cast<std::size_t>(n));
  cpu::adamw(p.data(), m.data(), v.data(), g.data(), out.data(), n, cpu::AdamWStep{});
  // Step 1 of Adam moves every weight by about lr against the gradient's sign.
  CHECK(p[0] == doctest::Approx(1.0 * (1 - 1e-3 * 0.01) - 1e-3).epsilon(1e-5));
  CHECK(out[0] == cpu::float_to_bf16(p[0]));
  cpu::sign_sgd(p.data(), g.data(), nullptr, n, cpu::SignSGDStep{});
  CHECK(p[5] == doctest::Approx(1.0 * (1 - 1e-3 * 0.01) - 2e-3).epsilon(1e-5));
}

TEST_CASE("streaming stores and software prefetch change no byte of the result") {
  const std::int64_t n = 70001;
  const std::size_t un = static_cast<std::size_t>(n);
  std::mt19937 rng(21);
  std::vector<float> p0(un), m0(un), v0(un);
  Buffer<std::uint16_t> g(un);
  fill_state(rng, n, p0.data(), m0.data(), v0.data());
  fill_grads(rng, n, g.data(), nullptr);
  const std::int64_t saved_threshold = cpu::streaming_store_threshold();
  const std::int64_t saved_prefetch = cpu::prefetch_distance();
  for (cpu::Isa isa : supported_isas()) {
    const std::string isa_name = cpu::to_string(isa);
    CAPTURE(isa_name);
    std::vector<std::vector<std::uint16_t>> outs;
    std::vector<std::vector<float>> masters;
    for (std::int64_t threshold : {std::int64_t{0}, std::int64_t{-1}, std::int64_t{1} << 15}) {
      cpu::set_streaming_store_threshold(threshold);
      // 1000 elements ahead runs past the end of every buffer in the last steps.
      for (std::int64_t ahead : {std::int64_t{0}, std::int64_t{1000}}) {
        cpu::set_prefetch_distance(ahead);
        for (std::size_t offset : {std::size_t{0}, std::size_t{3}}) {
          std::vector<float> p = p0, m = m0, v = v0;
          Buffer<std::uint16_t> out(un, offset);
          cpu::adamw(isa, p.data(), m.data(), v.data(), g.data(), out.data(), n, cpu::AdamWStep{});
          outs.emplace_back(out.data(), out.data() + un);
          masters.push_back(p);
          std::vector<float> q = p0;
          Buffer<std::uint16_t> out2(un, offset);
          cpu::sign_sgd(isa, q.data(), g.data(), out2.data(), n, cpu::SignSGDStep{});
          check_bf16_out(q.data(), out2.data(), n);
        }
      }
    }
    for (const auto& o : outs) CHECK(o == outs.front());
    for (const auto& p : masters)
      CHECK(std::memcmp(p.data(), masters.front().data(), un * sizeof(float)) == 0);
  }
  cpu::set_streaming_store_threshold(saved_threshold);
  cpu::set_prefetch_distance(saved_prefetch);
  CHECK(cpu::prefetch_distance() == saved_prefetch);
  cpu::set_prefetch_distance(-5);
  CHECK(cpu::prefetch_distance() == 0);
  cpu::set_prefetch_distance(saved_prefetch);
}
