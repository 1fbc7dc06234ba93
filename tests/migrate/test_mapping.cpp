// One test per rule of the offload mapping and per error (docs/migration.md).
#include "helpers.hpp"

using namespace mt;

TEST_CASE("optim_cpu_offload = true alone becomes offload = \"optimizer\"") {
  auto r = run("[model]\nname = \"m\"\noptim_cpu_offload = true\n");
  CHECK_FALSE(r.failed());
  CHECK(r.migrated == "[model]\nname = \"m\"\noffload = \"optimizer\"\n");
  CHECK(count(r, level::warning) == 0);
}

TEST_CASE("optim_cpu_offload = false alone becomes offload = \"none\"") {
  CHECK(migrated("[model]\noptim_cpu_offload = false\nname = \"m\"\n") ==
        "[model]\noffload = \"none\"\nname = \"m\"\n");
}

TEST_CASE("full_offload = true with optim_cpu_offload = false becomes offload = \"full\"") {
  auto r = run("[model]\noptim_cpu_offload = false\nfull_offload = true\n");
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK_FALSE(has(r, level::note, "old validator"));
}

TEST_CASE("full_offload = true with optim_cpu_offload left at its default: full, with a note") {
  auto r = run("[model]\nfull_offload = true\n");
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK(has(r, level::note, "rejected by the old validator", 2));
}

TEST_CASE("a [model.full_offload] table turns full offload on") {
  auto r =
      run("[model]\n"
          "optim_cpu_offload = false\n"
          "\n"
          "[model.full_offload]\n"
          "numa_bind = true\n"
          "cpu_optimizer_backend = \"native\"\n");
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK(count(r, level::warning) == 0);  // numa_bind = true and the native backend are what happens now
}

TEST_CASE("an empty full_offload table turns full offload on") {
  CHECK(migrated("[model]\noptim_cpu_offload = false\nfull_offload = {}\n") ==
        "[model]\noffload = \"full\"\n");
}

TEST_CASE("numa_bind = false is removed with a warning that behaviour changed") {
  auto r = run("[model]\noptim_cpu_offload = false\nfull_offload = { numa_bind = false }\n");
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK(has(r, level::warning, "always binds", 3));
}

TEST_CASE("cpu_optimizer_backend = \"torch\" is removed with a warning that behaviour changed") {
  auto r =
      run("[model]\noptim_cpu_offload = false\n[model.full_offload]\ncpu_optimizer_backend = \"torch\"\n");
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK(has(r, level::warning, "native CPU optimizer kernel", 4));
}

TEST_CASE(
    "branch schema: [model.optim_cpu_offload] with full = true becomes full, knobs dropped with notes") {
  auto r =
      run("[model]\n"
          "name = \"m\"\n"
          "\n"
          "[model.optim_cpu_offload]\n"
          "full = true\n"
          "transfer_buffer_count = 4\n"
          "max_inflight_backwards = 16\n"
          "timeout_seconds = 600\n"
          "gradients = true\n");
  CHECK(r.migrated == "[model]\nname = \"m\"\noffload = \"full\"\n");
  CHECK(has(r, level::note, "transfer_buffer_count", 6));
  CHECK(has(r, level::note, "max_inflight_backwards", 7));
  CHECK(has(r, level::note, "timeout_seconds", 8));
  CHECK(has(r, level::note, "gradients", 9));
  CHECK_FALSE(has(r, level::note, "old validator"));
}

TEST_CASE("branch schema: an empty [model.optim_cpu_offload] is state offload, i.e. \"optimizer\"") {
  CHECK(migrated("[model]\nname = \"m\"\n\n[model.optim_cpu_offload]\n") ==
        "[model]\nname = \"m\"\noffload = \"optimizer\"\n");
}

TEST_CASE("branch schema: full = false in the table is still \"optimizer\"") {
  CHECK(migrated("[model.optim_cpu_offload]\nfull = false\n") == "[model]\noffload = \"optimizer\"\n");
}

TEST_CASE("error: optim_cpu_offload = true written out together with full offload is ambiguous") {
  const std::string in = "[model]\noptim_cpu_offload = true\nfull_offload = true\n";
  auto r = run(in);
  CHECK(r.failed());
  CHECK(has(r, level::error, "ambiguous", 2));
  CHECK(r.migrated == in);
}

TEST_CASE("error: fsdp_cpu_offload = true explains the removal and the way out") {
  const std::string in = "[model]\nname = \"m\"\nfsdp_cpu_offload = true\n";
  auto r = run(in);
  CHECK(r.failed());
  CHECK(has(r, level::error, "FSDP CPU offload was removed", 3));
  CHECK(has(r, level::error, "host RAM", 3));
  CHECK(has(r, level::error, "--fsdp-as=full", 3));
  CHECK(r.migrated == in);
}

TEST_CASE("--fsdp-as=full maps fsdp_cpu_offload = true to \"full\"") {
  auto r = run("[model]\nfsdp_cpu_offload = true\noptim_cpu_offload = false\n", true);
  CHECK_FALSE(r.failed());
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK(has(r, level::note, "--fsdp-as=full", 2));
}

TEST_CASE("--fsdp-as=full still refuses an explicit optim_cpu_offload = true") {
  auto r = run("[model]\nfsdp_cpu_offload = true\noptim_cpu_offload = true\n", true);
  CHECK(has(r, level::error, "ambiguous", 3));
}

TEST_CASE("fsdp_cpu_offload = false, full_offload = false and full_offload = \"None\" are removed") {
  SUBCASE("fsdp_cpu_offload = false") {
    CHECK(migrated("[model]\nname = \"m\"\nfsdp_cpu_offload = false\n") == "[model]\nname = \"m\"\n");
  }
  SUBCASE("full_offload = false") {
    CHECK(migrated("[model]\nfull_offload = false\nname = \"m\"\n") == "[model]\nname = \"m\"\n");
  }
  SUBCASE("full_offload = \"None\"") {
    CHECK(migrated("[model]\nname = \"m\"\nfull_offload = \"None\"\n") == "[model]\nname = \"m\"\n");
  }
  SUBCASE("next to optim_cpu_offload = false") {
    CHECK(migrated("[model]\nfsdp_cpu_offload = false\noptim_cpu_offload = false\nfull_offload = false\n") ==
          "[model]\noffload = \"none\"\n");
  }
}

TEST_CASE("numa_bind = true and cpu_optimizer_backend = \"native\" are removed silently") {
  auto r = run("[model]\nfull_offload = { numa_bind = true, cpu_optimizer_backend = \"native\" }\n");
  CHECK(r.migrated == "[model]\noffload = \"full\"\n");
  CHECK(count(r, level::warning) == 0);
}

TEST_CASE("error: offload already set next to a legacy key") {
  const std::string in = "[model]\noffload = \"full\"\noptim_cpu_offload = false\n";
  auto r = run(in);
  CHECK(has(r, level::error, "already set (line 2)", 3));
  CHECK(r.migrated == in);
}

TEST_CASE("a config that already uses offload is left alone") {
  const std::string in = "[model]\noffload = \"none\"\n";
  auto r = run(in);
  CHECK_FALSE(r.changed());
  CHECK(r.findings.empty());
}

TEST_CASE("error: legacy keys with values of the wrong type") {
  CHECK(has(run("[model]\noptim_cpu_offload = 3\n"), level::error, "must be true, false or a table", 2));
  CHECK(has(run("[model]\nfull_offload = \"yes\"\n"), level::error,
            "must be true, false, \"None\" or a table", 2));
  CHECK(has(run("[model]\nfsdp_cpu_offload = \"no\"\n"), level::error, "must be true or false", 2));
  CHECK(
      has(run("[model.full_offload]\nnuma_bind = 1\n"), level::error, "numa_bind must be true or false", 2));
  CHECK(has(run("[model.full_offload]\ncpu_optimizer_backend = 1\n"), level::error, "must be a string", 2));
}

TEST_CASE("error: an unknown key inside a legacy table") {
  auto r = run("[model]\noptim_cpu_offload = false\n[model.full_offload]\nthreads = 8\n");
  CHECK(has(r, level::error, "unknown key model.full_offload.threads", 4));
  CHECK_FALSE(r.changed());
}

TEST_CASE("error: a file that is not TOML names the line") {
  auto r = run("[model]\noptim_cpu_offload = \n");
  CHECK(r.failed());
  CHECK(has(r, level::error, "not valid TOML", 2));
}

TEST_CASE("legacy names outside a model table are left alone with a warning") {
  const std::string in = "[train]\nfsdp_cpu_offload = true\n";
  auto r = run(in);
  CHECK_FALSE(r.failed());
  CHECK_FALSE(r.changed());
  CHECK(has(r, level::warning, "train.fsdp_cpu_offload is not in a model table", 2));
}

TEST_CASE("[model] and [trainer.model] are migrated independently") {
  CHECK(migrated("[model]\noptim_cpu_offload = false\n\n[trainer.model]\nfull_offload = true\n") ==
        "[model]\noffload = \"none\"\n\n[trainer.model]\noffload = \"full\"\n");
}

TEST_CASE("an error in one table leaves the whole file untouched") {
  const std::string in = "[model]\noptim_cpu_offload = false\n\n[trainer.model]\nfsdp_cpu_offload = true\n";
  auto r = run(in);
  CHECK(r.failed());
  CHECK(r.migrated == in);
}
