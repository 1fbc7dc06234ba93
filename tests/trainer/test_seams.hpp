// Sets the FullOffload test seams (reference_trainer/offload/shared/test_seams.hpp) for the
// runs made while it lives:
//
//   train::TestSeams seams({.defer = true});
#pragma once

#include "offload/shared/test_seams.hpp"

namespace primecfg::train {

namespace test_seams {
extern FullOffload full_offload_for_tests;
}

class TestSeams {
 public:
  explicit TestSeams(test_seams::FullOffload s) : saved_(test_seams::full_offload_for_tests) {
    test_seams::full_offload_for_tests = s;
  }
  TestSeams(const TestSeams&) = delete;
  TestSeams& operator=(const TestSeams&) = delete;
  ~TestSeams() { test_seams::full_offload_for_tests = saved_; }

 private:
  test_seams::FullOffload saved_;
};

}  // namespace primecfg::train
