// Benchmark of the fused CPU optimizer kernels (FullOffload), one command, one table:
//   - streaming copy and triad with the same thread pool: the machine's memory bandwidth, measured now
//   - our AdamW (bf16 grad in, fp32 master/moments updated, bf16 weight out) and SignSGD
//   - the peer: torch.optim.AdamW(fused=True) on CPU tensors plus the casts the same update needs
//     (bf16 grad -> fp32 .grad, fp32 param -> bf16 copy), run by torch_adamw_peer.py in a child
//     process after our measurements
// for each thread count. No timing here is a test; see docs/cpu-optimizer.md for the targets.
//
//   bench_cpu_optim [--n N] [--iters K] [--threads 1,2,4] [--isa avx512|avx2|scalar]
//                   [--peer "python3 bench/cpu_optim/torch_adamw_peer.py"] [--no-peer]
//                   [--gpu-bus-id 0000:00:06.0] [--markdown FILE] [--stream-min ELEMENTS]
#include <immintrin.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "offload/full/numa/numa_binding.hpp"
#include "optim/cpu/cpu_optim.hpp"

#ifndef PRIMECFG_BENCH_PEER
#define PRIMECFG_BENCH_PEER "python3 bench/cpu_optim/torch_adamw_peer.py"
#endif

namespace cpu = primecfg::train::cpu;
namespace numa = primecfg::train::numa;

namespace {

struct Options {
  std::int64_t n = std::int64_t{1} << 26;  // 64 Mi parameters: 1.8 GB of optimizer traffic per step
  int iters = 10;
  int warmup = 2;
  std::vector<int> threads;
  std::string isa;
  std::string peer;
  bool run_peer = true;
  std::string gpu_bus_id;
  std::string markdown;
  int pieces = 4;
  bool hugepages = false;
};

template <class T>
struct Free {
  void operator()(T* p) const { std::free(p); }
};
template <class T>
using Array = std::unique_ptr<T[], Free<T>>;

bool g_hugepages = false;

template <class T>
Array<T> alloc(std::int64_t n) {
  const std::size_t bytes = (static_cast<std::size_t>(n) * sizeof(T) + 4095) / 4096 * 4096;
  T* p = static_cast<T*>(std::aligned_alloc(4096, bytes));
  if (p == nullptr) {
    std::fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
    std::exit(2);
  }
  if (g_hugepages) ::madvise(p, bytes, MADV_HUGEPAGE);
  return Array<T>(p);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <class F>
double median_seconds(int warmup, int iters, F&& f) {
  for (int i = 0; i < warmup; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    const double a = now_s();
    f();
    t.push_back(now_s() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Bandwidth kernels, compiled for the best vector unit at run time.
__attribute__((target_clones("avx512f", "avx2", "default"))) void triad(float* a, const float* b,
                                                                        const float* c, float s,
                                                                        std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = b[i] + s * c[i];
}

// a[i] = a[i] * s + b[i]: read-modify-write like the optimizer's master and moments (12 B/elem,
// no write-allocate traffic).
__attribute__((target_clones("avx512f", "avx2", "default"))) void update(float* a, const float* b, float s,
                                                                         std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) a[i] = a[i] * s + b[i];
}

// Copy and triad with streaming stores (no write-allocate read). Pieces start 64-byte aligned.
__attribute__((target("avx512f"))) void copy_nt_avx512(float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_stream_ps(a + i, _mm512_load_ps(b + i));
  for (; i < n; ++i) a[i] = b[i];
  _mm_sfence();
}
__attribute__((target("avx2"))) void copy_nt_avx2(float* a, const float* b, std::int64_t n) {
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_stream_ps(a + i, _mm256_load_ps(b + i));
  for (; i < n; ++i) a[i] = b[i];
  _mm_sfence();
}
__attribute__((target("avx512f"))) void triad_nt_avx512(float* a, const float* b, const float* c, float s,
                                                        std::int64_t n) {
  const __m512 k = _mm512_set1_ps(s);
  std::int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_stream_ps(a + i, _mm512_add_ps(_mm512_load_ps(b + i), _mm512_mul_ps(k, _mm512_load_ps(c + i))));
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
  _mm_sfence();
}
__attribute__((target("avx2"))) void triad_nt_avx2(float* a, const float* b, const float* c, float s,
                                                   std::int64_t n) {
  const __m256 k = _mm256_set1_ps(s);
  std::int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_stream_ps(a + i, _mm256_add_ps(_mm256_load_ps(b + i), _mm256_mul_ps(k, _mm256_load_ps(c + i))));
  }
  for (; i < n; ++i) a[i] = b[i] + s * c[i];
  _mm_sfence();
}

std::string shell_output(const std::string& cmd) {
  std::string out;
  if (FILE* f = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, got);
    ::pclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
  return out;
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown CPU";
}

struct Row {
  int threads;
  std::string what;
  double seconds;
  double bytes_per_param;  // 0: bandwidth row (bytes given directly)
  double bytes;            // total bytes counted per iteration
  double gparams;          // 0 for bandwidth rows
};

std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) v.push_back(std::atoi(part.c_str()));
  }
  return v;
}

// Minimal reader for the peer's output lines: RESULT <name> <threads> <seconds>
std::map<std::pair<std::string, int>, double> run_peer(const Options& o, const std::string& threads_csv) {
  std::map<std::pair<std::string, int>, double> res;
  const std::string cmd = o.peer + " --n " + std::to_string(o.n) + " --iters " + std::to_string(o.iters) +
                          " --warmup " + std::to_string(o.warmup) + " --threads " + threads_csv;
  std::fprintf(stderr, "peer: %s\n", cmd.c_str());
  std::fflush(stderr);
  const std::string out = shell_output(cmd + " 2>&1");
  std::stringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream ls(line);
    std::string tag, name;
    int t;
    double s;
    if (ls >> tag >> name >> t >> s && tag == "RESULT") {
      res[{name, t}] = s;
    } else if (!line.empty()) {
      std::fprintf(stderr, "peer| %s\n", line.c_str());
    }
  }
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string command = argv[0];
  for (int i = 1; i < argc; ++i) {
    command += std::string(" ") + argv[i];
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      command += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--n")
      o.n = std::atoll(next().c_str());
    else if (a == "--iters")
      o.iters = std::max(1, std::atoi(next().c_str()));
    else if (a == "--warmup")
      o.warmup = std::max(0, std::atoi(next().c_str()));
    else if (a == "--threads")
      o.threads = parse_int_list(next());
    else if (a == "--isa")
      o.isa = next();
    else if (a == "--peer")
      o.peer = next();
    else if (a == "--no-peer")
      o.run_peer = false;
    else if (a == "--gpu-bus-id")
      o.gpu_bus_id = next();
    else if (a == "--markdown")
      o.markdown = next();
    else if (a == "--pieces")
      o.pieces = std::max(1, std::atoi(next().c_str()));
    else if (a == "--hugepages")
      o.hugepages = true;
    else if (a == "--stream-min")
      cpu::set_streaming_store_threshold(std::atoll(next().c_str()));
    else if (a == "--prefetch")
      cpu::set_prefetch_distance(std::atoll(next().c_str()));
    else {
      std::fprintf(
          stderr,
          "usage: %s [--n N] [--iters K] [--warmup W] [--threads 1,2,4] [--isa avx512|avx2|scalar]\n"
          "          [--peer CMD] [--no-peer] [--gpu-bus-id BUS] [--markdown FILE] [--stream-min ELEMENTS]\n"
          "          [--prefetch ELEMENTS] [--pieces PER_THREAD] [--hugepages]\n",
          argv[0]);
      return a == "--help" ? 0 : 2;
    }
  }
  if (o.n < 1024) o.n = 1024;
  if (o.peer.empty()) o.peer = PRIMECFG_BENCH_PEER;
  if (!o.isa.empty()) {
    cpu::Isa isa;
    if (!cpu::parse_isa(o.isa, isa) || !cpu::set_active_isa(isa)) {
      std::fprintf(stderr, "ISA '%s' is unknown or not supported by this CPU\n", o.isa.c_str());
      return 2;
    }
  }

  std::vector<int> bind_cpus;
  std::string bind_note = "none";
  if (!o.gpu_bus_id.empty()) {
    const auto b = numa::find_gpu_binding(o.gpu_bus_id);
    if (!b.ok) {
      std::fprintf(stderr, "error: %s\n", b.message.c_str());
      return 2;
    }
    if (!b.message.empty()) std::fprintf(stderr, "warning: %s\n", b.message.c_str());
    bind_cpus = b.cpus;
    bind_note = b.bind ? "node " + std::to_string(b.numa_node) + " cpus " + numa::format_cpulist(b.cpus)
                       : "not bound (" + b.message + ")";
  }
  const int max_threads = static_cast<int>(bind_cpus.empty() ? cpu::allowed_cpus().size() : bind_cpus.size());
  if (o.threads.empty()) {
    for (int t = 1; t < max_threads; t *= 2) o.threads.push_back(t);
    o.threads.push_back(max_threads);
  }
  std::string threads_csv;
  for (int t : o.threads) threads_csv += (threads_csv.empty() ? "" : ",") + std::to_string(t);

  const std::int64_t n = o.n;
  g_hugepages = o.hugepages;
  utsname un{};
  ::uname(&un);
  std::time_t tt = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&tt));
  std::string commit = shell_output("git rev-parse --short HEAD 2>/dev/null");
  if (commit.empty() && std::getenv("PRIMECFG_COMMIT") != nullptr) commit = std::getenv("PRIMECFG_COMMIT");
  std::ostringstream head;
  head << "- date: " << date << "\n"
       << "- machine: " << un.nodename << ", " << cpu_model() << ", " << cpu::allowed_cpus().size()
       << " CPUs usable, kernel path " << cpu::to_string(cpu::active_isa()) << " (best "
       << cpu::to_string(cpu::best_isa()) << ")\n"
       << "- commit: " << (commit.empty() ? "unknown" : commit) << "\n"
       << "- command: `" << command << "`\n"
       << "- parameters per step: " << n << " (median of " << o.iters << " iterations after " << o.warmup
       << " warm-up), binding: " << bind_note << ", streaming bf16 stores from "
       << cpu::streaming_store_threshold() << " elements per piece, software prefetch "
       << cpu::prefetch_distance() << " elements ahead, " << o.pieces << " pieces per thread"
       << (o.hugepages ? ", buffers madvise(MADV_HUGEPAGE)" : "") << "\n"
       << "- % of stream BW: against the fastest of the stream rows at the same thread count\n";
  std::printf("%s\n", head.str().c_str());
  std::fflush(stdout);

  // Optimizer state: fp32 master and moments, bf16 gradient and bf16 weight copy (the upload buffer).
  auto p = alloc<float>(n), m = alloc<float>(n), v = alloc<float>(n);
  auto g = alloc<std::uint16_t>(n), out = alloc<std::uint16_t>(n);
  // Bandwidth arrays.
  auto a = alloc<float>(n), b = alloc<float>(n), c = alloc<float>(n);

  std::vector<Row> rows;
  for (int t : o.threads) {
    cpu::ThreadPoolOptions po;
    po.threads = t;
    po.cpus = bind_cpus;
    po.pieces_per_thread = o.pieces;
    cpu::ThreadPool pool(po);
    const std::int64_t grain = cpu::kDefaultGrain;
    // First touch by the pool (pages land on the workers' node), and sane values (no denormals).
    pool.parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t i = lo; i < hi; ++i) {
        const float x = static_cast<float>((i * 2654435761u) % 1000u) * 1e-3f - 0.5f;
        p[i] = 0.02f * x;
        m[i] = 1e-3f * x;
        v[i] = 1e-6f;
        g[i] = cpu::float_to_bf16(1e-3f * x + 1e-4f);
        out[i] = 0;
        a[i] = x;
        b[i] = 1.0f;
        c[i] = x;
      }
    });

    const double copy_s = median_seconds(o.warmup, o.iters, [&] {
      pool.parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
        std::memcpy(a.get() + lo, b.get() + lo, static_cast<std::size_t>(hi - lo) * sizeof(float));
      });
    });
    rows.push_back({t, "stream copy (8 B/elem)", copy_s, 0, 8.0 * n, 0});
    const double triad_s = median_seconds(o.warmup, o.iters, [&] {
      pool.parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
        triad(a.get() + lo, b.get() + lo, c.get() + lo, 0.5f, hi - lo);
      });
    });
    rows.push_back({t, "stream triad (12 B/elem)", triad_s, 0, 12.0 * n, 0});

    if (cpu::best_isa() != cpu::Isa::scalar) {
      const bool w512 = cpu::best_isa() == cpu::Isa::avx512;
      const double copy_nt_s = median_seconds(o.warmup, o.iters, [&] {
        pool.parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
          if (w512)
            copy_nt_avx512(a.get() + lo, b.get() + lo, hi - lo);
          else
            copy_nt_avx2(a.get() + lo, b.get() + lo, hi - lo);
        });
      });
      rows.push_back({t, "stream copy, NT stores (8 B/elem)", copy_nt_s, 0, 8.0 * n, 0});
      const double triad_nt_s = median_seconds(o.warmup, o.iters, [&] {
        pool.parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
          if (w512)
            triad_nt_avx512(a.get() + lo, b.get() + lo, c.get() + lo, 0.5f, hi - lo);
          else
            triad_nt_avx2(a.get() + lo, b.get() + lo, c.get() + lo, 0.5f, hi - lo);
        });
      });
      rows.push_back({t, "stream triad, NT stores (12 B/elem)", triad_nt_s, 0, 12.0 * n, 0});
    }
    const double update_s = median_seconds(o.warmup, o.iters, [&] {
      pool.parallel_for(n, grain, [&](std::int64_t lo, std::int64_t hi) {
        update(a.get() + lo, b.get() + lo, 0.5f, hi - lo);
      });
    });
    rows.push_back({t, "stream update a=a*s+b (12 B/elem)", update_s, 0, 12.0 * n, 0});

    std::int64_t step = 0;
    const double adam_s = median_seconds(o.warmup, o.iters, [&] {
      cpu::AdamWStep s{1e-3f, 0.9f, 0.999f, 1e-8f, 0.01f, ++step, 1.0f};
      cpu::parallel_adamw(pool, p.get(), m.get(), v.get(), g.get(), out.get(), n, s, grain);
    });
    const double adam_b = cpu::adamw_bytes_per_param(true, true);
    rows.push_back({t, "primecfg AdamW bf16->bf16", adam_s, adam_b, adam_b * n, n / adam_s * 1e-9});
    const double sign_s = median_seconds(o.warmup, o.iters, [&] {
      cpu::parallel_sign_sgd(pool, p.get(), g.get(), out.get(), n, {1e-4f, 0.01f, 1.0f}, grain);
    });
    const double sign_b = cpu::sign_sgd_bytes_per_param(true, true);
    rows.push_back({t, "primecfg SignSGD bf16->bf16", sign_s, sign_b, sign_b * n, n / sign_s * 1e-9});
    std::fprintf(stderr,
                 "threads %d: copy %.1f GB/s, triad %.1f GB/s, AdamW %.2f Gparam/s, SignSGD %.2f Gparam/s\n",
                 t, 8.0 * n / copy_s * 1e-9, 12.0 * n / triad_s * 1e-9, n / adam_s * 1e-9, n / sign_s * 1e-9);
  }
  // Free our buffers before the peer allocates its own.
  p.reset();
  m.reset();
  v.reset();
  g.reset();
  out.reset();
  a.reset();
  b.reset();
  c.reset();

  std::map<std::pair<std::string, int>, double> peer;
  if (o.run_peer) peer = run_peer(o, threads_csv);
  for (int t : o.threads) {
    if (auto it = peer.find({"torch_adamw_path", t}); it != peer.end()) {
      rows.push_back({t, "torch AdamW(fused) + casts", it->second, 40.0, 40.0 * n, n / it->second * 1e-9});
    }
    if (auto it = peer.find({"torch_adamw_fused_only", t}); it != peer.end()) {
      rows.push_back({t, "torch AdamW(fused), fp32 only", it->second, 28.0, 28.0 * n, n / it->second * 1e-9});
    }
  }

  // Table: per thread count, rows in order; % of bandwidth against the best streaming kernel of the same
  // thread count; speed-up against the torch path of the same thread count.
  std::ostringstream table;
  table << "| threads | kernel | ms / step | G params/s | B/param | GB/s | % of stream BW | vs torch path |\n"
        << "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  for (int t : o.threads) {
    double bw = 0, torch_s = 0;
    for (const Row& r : rows) {
      if (r.threads != t) continue;
      if (r.bytes_per_param == 0) bw = std::max(bw, r.bytes / r.seconds);
      if (r.what == "torch AdamW(fused) + casts") torch_s = r.seconds;
    }
    std::vector<const Row*> sorted;
    for (const Row& r : rows) {
      if (r.threads == t) sorted.push_back(&r);
    }
    for (const Row* r : sorted) {
      char line[512];
      const double gbs = r->bytes / r->seconds * 1e-9;
      std::string gp = r->gparams > 0 ? std::to_string(r->gparams).substr(0, 5) : "";
      std::string bpp = r->bytes_per_param > 0 ? std::to_string(static_cast<int>(r->bytes_per_param)) : "";
      std::string pct =
          bw > 0 ? std::to_string(static_cast<int>(std::lround(100.0 * (r->bytes / r->seconds) / bw))) + "%"
                 : "";
      std::string vs;
      if (torch_s > 0 && r->what.rfind("primecfg AdamW", 0) == 0) {
        char x[32];
        std::snprintf(x, sizeof x, "%.2fx", torch_s / r->seconds);
        vs = x;
      }
      std::snprintf(line, sizeof line, "| %d | %s | %.2f | %s | %s | %.1f | %s | %s |\n", t, r->what.c_str(),
                    r->seconds * 1e3, gp.c_str(), bpp.c_str(), gbs, pct.c_str(), vs.c_str());
      table << line;
    }
  }
  std::printf("%s", table.str().c_str());
  if (o.run_peer && peer.empty())
    std::printf("\n(the torch peer produced no results; see the peer| lines above)\n");
  if (!o.markdown.empty()) {
    std::ofstream md(o.markdown);
    md << head.str() << "\n" << table.str();
  }
  return 0;
}
