// The run's folders on disk, without LibTorch: one writer per output_dir (a lock),
// a fresh run never mixed with an old one, checkpoint folders that are complete or
// absent (written under a temporary name, fsynced, renamed), a manifest written
// last that resume verifies file by file (size and xxHash64), and pruning that
// never removes the newest complete checkpoints.
//
//   <ckpt_root>/step_N/    model.safetensors (or files of at most 5 GB and
//                          model.safetensors.index.json: checkpoint/weight_files.hpp),
//                          config.json, tokenizer files,
//                          optimizer.safetensors, trainer_state.safetensors,
//                          manifest.json (last)
//   <ckpt_root>/.step_N.tmp/   while step N is being written
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace primecfg::train {

// A problem with the run's files that the user must resolve (message names the path).
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where training stands; what a checkpoint stores besides tensors.
struct TrainPosition {
  std::int64_t step = 0;
  std::int64_t data_position = 0;
  std::int64_t scheduler_step = 0;
};

// trainer_state.safetensors' metadata as a position; every key present, each a
// non-negative integer, step equal to the folder's. `file` names the source in errors.
TrainPosition parse_trainer_state(const std::map<std::string, std::string>& metadata, const std::string& file,
                                  std::int64_t folder_step);

// Holds an exclusive lock on <dir>/.primecfg-train.lock for its lifetime (flock: the
// kernel drops it when the process dies). A second holder fails at once.
class OutputDirLock {
 public:
  explicit OutputDirLock(const std::filesystem::path& dir);
  ~OutputDirLock();
  OutputDirLock(const OutputDirLock&) = delete;
  OutputDirLock& operator=(const OutputDirLock&) = delete;

 private:
  int fd_ = -1;
};

std::filesystem::path step_dir(const std::filesystem::path& root, std::int64_t step);

// Steps of the complete checkpoints (those with a manifest) in root, ascending.
std::vector<std::int64_t> complete_checkpoints(const std::filesystem::path& root);

// Removes .step_N.tmp folders a killed run left behind (call with the lock held).
void remove_stale_temporaries(const std::filesystem::path& root);

// A new run (no [resume]) into output_dir: an error if the folder holds another run's
// metrics or checkpoints, unless clean, which first removes exactly what primecfg-train
// writes there (metrics.jsonl, config.toml, the checkpoints); nothing else is deleted.
void prepare_fresh_run(const std::filesystem::path& output_dir, const std::filesystem::path& ckpt_root,
                       bool clean);

// Resuming from `step`: later checkpoints (of a continuation being abandoned) move
// into <ckpt_root>/abandoned_after_step_<step>/, and metrics.jsonl lines of later steps
// into metrics.after_step_<step>.jsonl (-2, -3, ... when those exist), so that this run's history reads as
// one and nothing is deleted. Returns what was moved, for a note (empty if nothing).
std::string prepare_resume(const std::filesystem::path& output_dir, const std::filesystem::path& ckpt_root,
                           std::int64_t step);

// torchrun's restarts of one job (--max-restarts): the job that claims output_dir
// records its id there (<output_dir>/torchrun_job, written whole or not at all), so
// that a restart of it knows the folder as its own and continues it, while a folder
// of any other run stays under the rules of a new run.
void record_job(const std::filesystem::path& output_dir, const std::string& job_id);
bool written_by_job(const std::filesystem::path& output_dir, const std::string& job_id);

// text into path, whole or not at all: a temporary beside it, synced, then renamed
// over it (a failed write leaves the old file as it was); throws naming the path.
void replace_file(const std::filesystem::path& path, const std::string& text);

// fsync of a file or a folder; throws naming the path.
void fsync_path(const std::filesystem::path& path);

// What manifest.json records.
struct Manifest {
  std::int64_t step = 0;
  bool optimizer = false;  // optimizer.safetensors was written
  struct File {
    std::uint64_t bytes = 0;
    std::string xxh64;  // 16 hex digits
  };
  std::map<std::string, File> files;
};

// A file as the manifest records it: fsynced, then its size and xxHash64. A sharded
// save has each rank sum the file it wrote, so that no rank reads back every rank's
// files (Llama-3.1-70B's optimizer pieces are about 850 GB together).
Manifest::File sum_file(const std::filesystem::path& path);
// Sums every regular file in dir that `known` does not list (known: the sums of the
// files other ranks wrote; their sizes are checked), writes manifest.json, fsyncs it
// and the folder.
void write_manifest(const std::filesystem::path& dir, std::int64_t step, bool optimizer,
                    const std::map<std::string, Manifest::File>& known = {});
// Reads manifest.json and checks every file it lists (present, size) and the step
// against the folder's name; a safetensors file it does not list is an error. The
// checksums: of the files whose place in the manifest's (sorted) list is `part`
// modulo `parts`, so that the ranks of a resume share the reading, each file read once.
Manifest verify_checkpoint(const std::filesystem::path& dir, std::int64_t folder_step, int part = 0,
                           int parts = 1);

// After step `newest` was saved: removes the complete checkpoints older than the
// newest keep_last (newest included); never one at or after `newest`.
void prune_checkpoints(const std::filesystem::path& root, std::int64_t keep_last, std::int64_t newest);

// Moves a complete temporary folder into place: fsync, rename, fsync of root.
void publish_checkpoint(const std::filesystem::path& tmp, const std::filesystem::path& final_dir);

}  // namespace primecfg::train
