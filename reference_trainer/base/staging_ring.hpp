// A FIFO allocator of byte ranges inside one fixed buffer (the pinned staging
// rings of the offload strategies). Ranges are handed out in order and must be
// given back in the same order, which is how the copy pipelines consume them:
// gradients are processed in the order backward produced them, uploads finish in
// the order they were queued. No torch here, so the logic is tested on its own.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>

namespace primecfg::train {

class StagingRing {
 public:
  struct Range {
    std::size_t offset = 0;
    std::size_t bytes = 0;  // as asked for (the ring keeps its own aligned length)
    std::uint64_t id = 0;   // order of allocation
  };

  explicit StagingRing(std::size_t capacity = 0, std::size_t align = 256)
      : capacity_(capacity), align_(align) {}

  std::size_t capacity() const { return capacity_; }
  std::size_t in_use() const { return used_; }
  std::size_t live() const { return ranges_.size(); }
  bool empty() const { return ranges_.empty(); }

  // True when a request of `bytes` can ever be satisfied (the ring is large enough).
  bool fits_at_all(std::size_t bytes) const { return round(bytes) <= capacity_; }

  // A range of `bytes` (offset aligned to `align`), or nullopt when the free space
  // does not hold it now. Throws std::length_error when it never could.
  std::optional<Range> try_acquire(std::size_t bytes) {
    const std::size_t len = round(bytes);
    if (len > capacity_)
      throw std::length_error("staging ring of " + std::to_string(capacity_) + " bytes cannot hold " +
                              std::to_string(bytes) + " bytes");
    std::size_t at = 0;
    if (ranges_.empty()) {
      at = 0;
    } else {
      const std::size_t tail = ranges_.front().offset;  // oldest live range
      const std::size_t head = ranges_.back().offset + ranges_.back().len;
      if (head > tail) {
        // Live data is [tail, head): free space is [head, capacity) and [0, tail).
        if (capacity_ - head >= len)
          at = head;
        else if (tail >= len)
          at = 0;
        else
          return std::nullopt;
      } else {
        // Wrapped: live data is [tail, capacity) + [0, head); free space is [head, tail).
        if (tail - head >= len)
          at = head;
        else
          return std::nullopt;
      }
    }
    Entry e{at, len, next_id_++};
    ranges_.push_back(e);
    used_ += len;
    return Range{at, bytes, e.id};
  }

  // Gives back the oldest live range; `r` must be it.
  void release(const Range& r) {
    if (ranges_.empty() || ranges_.front().id != r.id)
      throw std::logic_error("staging ring: ranges must be released in allocation order");
    used_ -= ranges_.front().len;
    ranges_.pop_front();
  }

  // The oldest live range (to wait on before releasing it).
  std::optional<Range> oldest() const {
    if (ranges_.empty()) return std::nullopt;
    return Range{ranges_.front().offset, ranges_.front().len, ranges_.front().id};
  }

 private:
  struct Entry {
    std::size_t offset, len;
    std::uint64_t id;
  };
  std::size_t round(std::size_t b) const {
    return (std::max<std::size_t>(b, 1) + align_ - 1) / align_ * align_;
  }

  std::size_t capacity_, align_;
  std::deque<Entry> ranges_;
  std::size_t used_ = 0;
  std::uint64_t next_id_ = 0;
};

}  // namespace primecfg::train
