#include "checkpoint/dir.hpp"

#include "base/remove_tree.hpp"
#include "base/strict_json.hpp"

#include <fmt/format.h>
#include <xxhash.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <sstream>

namespace primecfg::train {

namespace fs = std::filesystem;
using i64 = std::int64_t;

namespace {

namespace json = strict_json;

[[noreturn]] void fail_errno(const fs::path& path, const char* what) {
  throw checkpoint_error(fmt::format("{}: {}: {}", path.string(), what, std::strerror(errno)));
}

std::optional<i64> step_of(const std::string& name, std::string_view prefix, std::string_view suffix = "") {
  if (name.size() <= prefix.size() + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const char* first = name.data() + prefix.size();
  const char* last = name.data() + name.size() - suffix.size();
  i64 v = 0;
  auto [end, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || end != last || v < 0) return std::nullopt;
  return v;
}

std::string read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw checkpoint_error(path.string() + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// xxHash64 of a file, read in 8 MiB pieces, and its size.
std::pair<std::string, std::uint64_t> hash_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path, "cannot open");
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buf(8 << 20);
  std::uint64_t total = 0;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      XXH64_freeState(state);
      errno = e;
      fail_errno(path, "read failed");
    }
    if (n == 0) break;
    XXH64_update(state, buf.data(), static_cast<std::size_t>(n));
    total += static_cast<std::uint64_t>(n);
  }
  ::close(fd);
  const XXH64_hash_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return {fmt::format("{:016x}", static_cast<unsigned long long>(h)), total};
}

void write_text(const fs::path& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail_errno(path, "cannot create");
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      errno = e;
      fail_errno(path, "write failed");
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) fail_errno(path, "write failed");
}

// dir/stem + suffix, or dir/stem-2 + suffix, -3, ... : the first that does not exist
// (resuming from one step twice keeps both abandoned continuations).
fs::path unused_name(const fs::path& dir, const std::string& stem, const std::string& suffix) {
  std::error_code ec;
  fs::path p = dir / (stem + suffix);
  for (int i = 2; fs::exists(p, ec); ++i) p = dir / fmt::format("{}-{}{}", stem, i, suffix);
  return p;
}

}  // namespace

fs::path step_dir(const fs::path& root, i64 step) { return root / fmt::format("step_{}", step); }

TrainPosition parse_trainer_state(const std::map<std::string, std::string>& metadata, const std::string& file,
                                  i64 folder_step) {
  auto get = [&](const char* key) -> i64 {
    auto it = metadata.find(key);
    if (it == metadata.end())
      throw checkpoint_error(fmt::format("{}: metadata \"{}\" is missing", file, key));
    i64 v = 0;
    const std::string& s = it->second;
    auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || v < 0)
      throw checkpoint_error(
          fmt::format("{}: metadata \"{}\" = \"{}\" is not a non-negative integer", file, key, s));
    return v;
  };
  TrainPosition p{get("step"), get("data_position"), get("scheduler_step")};
  if (p.step != folder_step)
    throw checkpoint_error(
        fmt::format("{}: metadata step = {} disagrees with its folder step_{}", file, p.step, folder_step));
  if (p.scheduler_step > p.step)
    throw checkpoint_error(
        fmt::format("{}: metadata scheduler_step = {} is after step = {}", file, p.scheduler_step, p.step));
  return p;
}

OutputDirLock::OutputDirLock(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw checkpoint_error(fmt::format("{}: cannot create the folder: {}", dir.string(), ec.message()));
  const fs::path path = dir / ".primecfg-train.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) fail_errno(path, "cannot open the lock file");
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    const ssize_t n = ::pread(fd_, pid, sizeof pid - 1, 0);
    ::close(fd_);
    fd_ = -1;
    throw checkpoint_error(fmt::format(
        "{}: another primecfg-train{} is writing to this output_dir; two runs in one folder would mix their "
        "checkpoints and metrics (wait for it, or choose another output_dir)",
        dir.string(), n > 0 ? fmt::format(" (pid {})", std::string(pid, static_cast<std::size_t>(n))) : ""));
  }
  const std::string me = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) != 0 || ::pwrite(fd_, me.data(), me.size(), 0) != static_cast<ssize_t>(me.size()))
    fail_errno(path, "cannot write the lock file");
}

OutputDirLock::~OutputDirLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock; the file stays (harmless, reused)
}

std::vector<i64> complete_checkpoints(const fs::path& root) {
  std::vector<i64> steps;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return steps;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    auto s = step_of(e.path().filename().string(), "step_");
    if (s && fs::is_regular_file(e.path() / "manifest.json", ec)) steps.push_back(*s);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

void remove_stale_temporaries(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string n = e.path().filename().string();
    if (step_of(n, ".step_", ".tmp") || step_of(n, ".step_", ".old")) stale.push_back(e.path());
  }
  for (const auto& p : stale) {
    remove_tree(p, ec);
    if (ec)
      throw checkpoint_error(
          fmt::format("{}: cannot remove a killed run's partial checkpoint: {}", p.string(), ec.message()));
  }
}

void prepare_fresh_run(const fs::path& output_dir, const fs::path& ckpt_root, bool clean) {
  std::error_code ec;
  std::vector<fs::path> found;
  for (const char* name : {"metrics.jsonl", "config.toml"})
    if (fs::exists(output_dir / name, ec)) found.push_back(output_dir / name);
  if (fs::is_directory(ckpt_root, ec))
    for (const auto& e : fs::directory_iterator(ckpt_root, ec))
      if (step_of(e.path().filename().string(), "step_")) found.push_back(e.path());
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  if (!clean)
    throw checkpoint_error(fmt::format(
        "{}: holds another run ({}{}); a new run there would mix with it. Resume it with [resume] (or "
        "--resume.step=N), set clean = true to delete that run's metrics, config.toml and checkpoints first, "
        "or choose another output_dir",
        output_dir.string(), found.front().string(),
        found.size() > 1 ? fmt::format(" and {} more", found.size() - 1) : ""));
  for (const auto& p : found) {
    remove_tree(p, ec);
    if (ec)
      throw checkpoint_error(fmt::format("{}: clean = true cannot remove it: {}", p.string(), ec.message()));
  }
}

std::string prepare_resume(const fs::path& output_dir, const fs::path& ckpt_root, i64 step) {
  std::string note;
  std::vector<i64> later;
  for (i64 s : complete_checkpoints(ckpt_root))
    if (s > step) later.push_back(s);
  std::error_code ec;
  if (!later.empty()) {
    const fs::path aside = unused_name(ckpt_root, fmt::format("abandoned_after_step_{}", step), "");
    fs::create_directories(aside, ec);
    for (i64 s : later) {
      fs::rename(step_dir(ckpt_root, s), step_dir(aside, s), ec);
      if (ec)
        throw checkpoint_error(
            fmt::format("{}: cannot move aside: {}", step_dir(ckpt_root, s).string(), ec.message()));
    }
    fsync_path(ckpt_root);
    note = fmt::format(
        "resuming from step {}: the later checkpoints step_{}{} moved to {}", step, later.front(),
        later.size() > 1 ? fmt::format(" .. step_{}", later.back()) : std::string(), aside.string());
  }
  // Metrics of steps after the checkpoint belong to the continuation being abandoned.
  const fs::path metrics = output_dir / "metrics.jsonl";
  if (!fs::is_regular_file(metrics, ec)) return note;
  std::istringstream in(read_all(metrics));
  std::string keep, moved, line;
  while (std::getline(in, line)) {
    i64 s = step + 1;  // a line cut by a kill goes with the abandoned part
    try {
      const json::value v = json::parse(line);
      if (const auto* st = json::find(v, "step"); st && json::integer(*st)) s = *json::integer(*st);
    } catch (const json::error&) {
    }
    (s > step ? moved : keep) += line + "\n";
  }
  if (moved.empty()) return note;
  const fs::path aside = unused_name(output_dir, fmt::format("metrics.after_step_{}", step), ".jsonl");
  write_text(aside, moved);
  replace_file(metrics, keep);
  return note + (note.empty() ? "" : "; ") +
         fmt::format("metrics of steps after {} moved to {}", step, aside.string());
}

void replace_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  std::error_code ec;
  try {
    write_text(tmp, text);
  } catch (const checkpoint_error&) {
    fs::remove(tmp, ec);
    throw;
  }
  fs::rename(tmp, path, ec);
  if (ec) throw checkpoint_error(fmt::format("{}: cannot replace: {}", path.string(), ec.message()));
}

void record_job(const fs::path& output_dir, const std::string& job_id) {
  replace_file(output_dir / "torchrun_job", job_id + "\n");
}

bool written_by_job(const fs::path& output_dir, const std::string& job_id) {
  std::error_code ec;
  const fs::path path = output_dir / "torchrun_job";
  if (job_id.empty() || !fs::is_regular_file(path, ec)) return false;
  return read_all(path) == job_id + "\n";
}

void fsync_path(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail_errno(path, "cannot open to sync");
  if (::fsync(fd) != 0) {
    const int e = errno;
    ::close(fd);
    errno = e;
    fail_errno(path, "fsync failed");
  }
  ::close(fd);
}

Manifest::File sum_file(const fs::path& path) {
  fsync_path(path);
  auto [hash, bytes] = hash_file(path);
  return {bytes, hash};
}

void write_manifest(const fs::path& dir, i64 step, bool optimizer,
                    const std::map<std::string, Manifest::File>& known) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != "manifest.json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  json::ordered manifest = {{"format", "primecfg-checkpoint/1"},
                            {"step", step},
                            {"optimizer", optimizer},
                            {"files", json::ordered::object()}};
  for (const auto& f : files) {
    const auto it = known.find(f.filename().string());
    Manifest::File sum;
    if (it == known.end()) {
      sum = sum_file(f);
    } else {
      std::error_code ec;
      const auto size = fs::file_size(f, ec);
      if (ec || size != it->second.bytes)
        throw checkpoint_error(
            fmt::format("{}: {} bytes, its writer summed {}", f.string(), ec ? 0 : size, it->second.bytes));
      sum = it->second;
    }
    manifest["files"][f.filename().string()] = {{"bytes", sum.bytes}, {"xxh64", sum.xxh64}};
  }
  for (const auto& [name, sum] : known)
    if (!fs::is_regular_file(dir / name))
      throw checkpoint_error(
          fmt::format("{}: summed by its writer, but not in the folder", (dir / name).string()));
  std::string text;
  try {
    text = json::dump(manifest, 2) + "\n";
  } catch (const json::error& e) {
    throw checkpoint_error(fmt::format("{}: {}", (dir / "manifest.json").string(), e.what()));
  }
  write_text(dir / "manifest.json", text);
  fsync_path(dir);
}

Manifest verify_checkpoint(const fs::path& dir, i64 folder_step, int part, int parts) {
  const fs::path mpath = dir / "manifest.json";
  std::error_code ec;
  if (!fs::is_regular_file(mpath, ec))
    throw checkpoint_error(
        fmt::format("{}: no manifest.json, so the checkpoint cannot be verified (incomplete, or written by a "
                    "primecfg-train before manifests)",
                    dir.string()));
  Manifest m;
  try {
    const json::value root = json::parse(read_all(mpath));
    const auto* format = json::find(root, "format");
    if (!format || !format->is_string() || *format != "primecfg-checkpoint/1")
      throw checkpoint_error(mpath.string() + ": \"format\" must be \"primecfg-checkpoint/1\"");
    const auto* step = json::find(root, "step");
    const auto* opt = json::find(root, "optimizer");
    const auto* files = json::find(root, "files");
    if (!step || !opt || !files || !files->is_object())
      throw checkpoint_error(mpath.string() + ": needs \"step\", \"optimizer\" and \"files\"");
    if (!json::integer(*step)) throw checkpoint_error(mpath.string() + ": \"step\" must be an integer");
    if (!opt->is_boolean()) throw checkpoint_error(mpath.string() + ": \"optimizer\" must be true or false");
    m.step = *json::integer(*step);
    m.optimizer = opt->get<bool>();
    for (const auto& [name, f] : files->items()) {
      const auto* bytes = json::find(f, "bytes");
      const auto* hash = json::find(f, "xxh64");
      const auto size = bytes ? json::integer(*bytes) : std::nullopt;
      if (!size || *size < 0 || !hash || !hash->is_string() || name.find('/') != std::string::npos)
        throw checkpoint_error(
            fmt::format("{}: entry \"{}\" is malformed (needs \"bytes\", an integer >= 0, "
                        "and \"xxh64\", a string)",
                        mpath.string(), name));
      m.files[name] = {static_cast<std::uint64_t>(*size), hash->get<std::string>()};
    }
  } catch (const json::error& e) {
    throw checkpoint_error(mpath.string() + ": " + e.what());
  }
  if (m.step != folder_step)
    throw checkpoint_error(
        fmt::format("{}: step = {} disagrees with its folder step_{}", mpath.string(), m.step, folder_step));
  for (const char* needed : {"config.json", "trainer_state.safetensors"})
    if (!m.files.count(needed))
      throw checkpoint_error(fmt::format("{}: does not list {}", mpath.string(), needed));
  // The weights: one file, or several and their index (checkpoint/weight_files.hpp).
  if (!m.files.count("model.safetensors") && !m.files.count("model.safetensors.index.json"))
    throw checkpoint_error(
        fmt::format("{}: lists neither model.safetensors nor model.safetensors.index.json", mpath.string()));
  // One process writes optimizer.safetensors, N ranks optimizer-RRRRR-of-NNNNN.safetensors.
  const bool has_optimizer = std::any_of(m.files.begin(), m.files.end(), [](const auto& f) {
    return f.first == "optimizer.safetensors" || f.first.rfind("optimizer-", 0) == 0;
  });
  if (m.optimizer != has_optimizer)
    throw checkpoint_error(mpath.string() + ": \"optimizer\" disagrees with the files it lists");
  int index = 0;
  for (const auto& [name, want] : m.files) {
    const bool mine = index++ % parts == part;
    const fs::path p = dir / name;
    if (!fs::is_regular_file(p, ec))
      throw checkpoint_error(fmt::format("{}: missing (the manifest lists it)", p.string()));
    const auto size = fs::file_size(p, ec);
    if (ec || size != want.bytes)
      throw checkpoint_error(fmt::format("{}: {} bytes, the manifest says {} (truncated or replaced?)",
                                         p.string(), ec ? 0 : size, want.bytes));
    if (!mine) continue;  // another rank reads it
    auto [hash, bytes] = hash_file(p);
    if (hash != want.xxh64)
      throw checkpoint_error(
          fmt::format("{}: checksum {} differs from the manifest's {}: the file changed after "
                      "it was written",
                      p.string(), hash, want.xxh64));
  }
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors" && !m.files.count(e.path().filename().string()))
      throw checkpoint_error(fmt::format("{}: not in the manifest (added after the checkpoint was written?)",
                                         e.path().string()));
  return m;
}

void prune_checkpoints(const fs::path& root, i64 keep_last, i64 newest) {
  std::vector<i64> older;
  for (i64 s : complete_checkpoints(root))
    if (s < newest) older.push_back(s);
  // keep_last counts the newest checkpoint itself.
  const auto keep_older = static_cast<std::size_t>(std::max<i64>(0, keep_last - 1));
  if (older.size() <= keep_older) return;
  std::error_code ec;
  for (std::size_t i = 0; i + keep_older < older.size(); ++i) {
    remove_tree(step_dir(root, older[i]), ec);
    if (ec)
      throw checkpoint_error(
          fmt::format("{}: keep_last cannot remove it: {}", step_dir(root, older[i]).string(), ec.message()));
  }
}

void publish_checkpoint(const fs::path& tmp, const fs::path& final_dir) {
  std::error_code ec;
  const fs::path root = final_dir.parent_path();
  // A folder of the same step (a save repeated after a resume at that step) is set
  // aside first, so that at every moment one complete checkpoint of the step exists.
  const fs::path aside = root / ("." + final_dir.filename().string() + ".old");
  if (fs::exists(final_dir, ec)) {
    remove_tree(aside, ec);
    fs::rename(final_dir, aside, ec);
    if (ec) throw checkpoint_error(fmt::format("{}: cannot set aside: {}", final_dir.string(), ec.message()));
  }
  fs::rename(tmp, final_dir, ec);
  if (ec)
    throw checkpoint_error(fmt::format("{}: cannot rename into place: {}", final_dir.string(), ec.message()));
  fsync_path(root);
  remove_tree(aside, ec);
}

}  // namespace primecfg::train
