// Every way a ModelConfig's legacy keys can be written, and the bytes around
// them that must survive.
#include "helpers.hpp"

using namespace mt;

TEST_CASE("[trainer.model] header") {
  CHECK(migrated("[trainer.model]\nimpl = \"custom\"\noptim_cpu_offload = true\ncp = 4\n") ==
        "[trainer.model]\nimpl = \"custom\"\noffload = \"optimizer\"\ncp = 4\n");
}

TEST_CASE("dotted keys at the top level keep their prefix") {
  CHECK(migrated("max_steps = 3\nmodel.optim_cpu_offload = false\n") ==
        "max_steps = 3\nmodel.offload = \"none\"\n");
  CHECK(migrated("trainer.model.full_offload = true\ntrainer.model.optim_cpu_offload = false\n") ==
        "trainer.model.offload = \"full\"\n");
}

TEST_CASE("dotted keys inside [trainer]") {
  CHECK(migrated("[trainer]\nmodel.name = \"m\"\nmodel.optim_cpu_offload = true\n") ==
        "[trainer]\nmodel.name = \"m\"\nmodel.offload = \"optimizer\"\n");
}

TEST_CASE("dotted keys into the legacy table") {
  auto r = run("[model]\nname = \"m\"\nfull_offload.numa_bind = false\noptim_cpu_offload = false\n");
  CHECK(r.migrated == "[model]\nname = \"m\"\noffload = \"full\"\n");
  CHECK(has(r, level::warning, "always binds", 3));
}

TEST_CASE("quoted keys and their spacing") {
  CHECK(migrated("[model]\n\"optim_cpu_offload\" = false\n") == "[model]\noffload = \"none\"\n");
  CHECK(migrated("[model]\noptim_cpu_offload=false\n") == "[model]\noffload=\"none\"\n");
  CHECK(migrated("[\"model\"]\n  optim_cpu_offload   =   true\n") ==
        "[\"model\"]\n  offload   =   \"optimizer\"\n");
  CHECK(migrated("\"model\".optim_cpu_offload = false\n") == "\"model\".offload = \"none\"\n");
}

TEST_CASE("inline tables") {
  SUBCASE("replace in place") {
    CHECK(migrated("model = { name = \"m\", optim_cpu_offload = false }\n") ==
          "model = { name = \"m\", offload = \"none\" }\n");
  }
  SUBCASE("two legacy entries, the first replaced, the second removed with its comma") {
    CHECK(migrated("model = { optim_cpu_offload = false, name = \"m\", full_offload = true }\n") ==
          "model = { offload = \"full\", name = \"m\" }\n");
  }
  SUBCASE("a removed first entry takes the following comma") {
    CHECK(migrated("model = { fsdp_cpu_offload = false, name = \"m\" }\n") == "model = { name = \"m\" }\n");
  }
  SUBCASE("an inline table left empty") {
    CHECK(migrated("model = { fsdp_cpu_offload = false }\n") == "model = {}\n");
  }
  SUBCASE("nested inline tables") {
    CHECK(migrated("trainer = { model = { optim_cpu_offload = false, full_offload = { numa_bind = true } }, "
                   "x = 1 }\n") == "trainer = { model = { offload = \"full\" }, x = 1 }\n");
  }
  SUBCASE("an inline legacy table as a value under [model]") {
    CHECK(
        migrated(
            "[model]\noptim_cpu_offload = false\nfull_offload = { cpu_optimizer_backend = \"native\" }\n") ==
        "[model]\noffload = \"full\"\n");
  }
}

TEST_CASE("a legacy sub-table is removed whole with its comments; the new key goes to the first legacy key") {
  CHECK(migrated("[model]\n"
                 "name = \"m\"\n"
                 "optim_cpu_offload = false  # needed for full offload\n"
                 "seq_len = 8\n"
                 "\n"
                 "[model.full_offload]\n"
                 "# pin to the GPU's node\n"
                 "numa_bind = true\n"
                 "cpu_optimizer_backend = \"native\" # fastest\n"
                 "\n"
                 "# about the optimizer\n"
                 "[optim]\n"
                 "lr = 1.0\n") ==
        "[model]\n"
        "name = \"m\"\n"
        "offload = \"full\"  # needed for full offload\n"
        "seq_len = 8\n"
        "\n"
        "# about the optimizer\n"
        "[optim]\n"
        "lr = 1.0\n");
}

TEST_CASE("only a sub-table: the key goes at the end of the [model] table's own keys") {
  CHECK(migrated("[trainer.model]\n"
                 "impl = \"custom\"\n"
                 "cp = 4\n"
                 "\n"
                 "[trainer.model.ac]\n"
                 "\n"
                 "[trainer.model.full_offload]\n"
                 "numa_bind = true\n"
                 "\n"
                 "[trainer.ckpt]\n") ==
        "[trainer.model]\n"
        "impl = \"custom\"\n"
        "cp = 4\n"
        "offload = \"full\"\n"
        "\n"
        "[trainer.model.ac]\n"
        "\n"
        "[trainer.ckpt]\n");
}

TEST_CASE("only a sub-table and no [model] header: the sub-table header becomes [model]") {
  CHECK(migrated("# overlay\n[model.full_offload]\nnuma_bind = true\n\n[data]\nx = 1\n") ==
        "# overlay\n[model]\noffload = \"full\"\n\n[data]\nx = 1\n");
  CHECK(migrated("[model.debug]\nx = 1\n[ model.optim_cpu_offload ]  # branch\nfull = true\n") ==
        "[model.debug]\nx = 1\n[ model ]  # branch\noffload = \"full\"\n");
}

TEST_CASE("only a sub-table, [model] written with dotted keys: the key joins them") {
  CHECK(migrated("model.name = \"m\"\n\n[model.full_offload]\nnuma_bind = true\n") ==
        "model.name = \"m\"\nmodel.offload = \"full\"\n");
}

TEST_CASE("an empty [model] header gets the key right below it") {
  CHECK(migrated("[model]\n\n[model.full_offload]\n") == "[model]\noffload = \"full\"\n");
}

TEST_CASE("text that only looks like legacy keys inside strings is not touched") {
  const std::string in =
      "[model]\n"
      "name = \"\"\"\n"
      "[model.full_offload]\n"
      "optim_cpu_offload = true\n"
      "\"\"\"\n"
      "tags = ['optim_cpu_offload = false', \"x\"]\n"
      "optim_cpu_offload = false\n";
  CHECK(migrated(in) ==
        "[model]\n"
        "name = \"\"\"\n"
        "[model.full_offload]\n"
        "optim_cpu_offload = true\n"
        "\"\"\"\n"
        "tags = ['optim_cpu_offload = false', \"x\"]\n"
        "offload = \"none\"\n");
}

TEST_CASE("arrays of tables are not model tables") {
  const std::string in = "[[model]]\noptim_cpu_offload = false\n";
  auto r = run(in);
  CHECK_FALSE(r.changed());
}

TEST_CASE("byte preservation: CRLF line endings, also on inserted lines") {
  CHECK(migrated("# c\r\n[model]\r\nname = \"m\"\r\noptim_cpu_offload = false\r\nfull_offload = "
                 "true\r\n\r\n[optim]\r\n") ==
        "# c\r\n[model]\r\nname = \"m\"\r\noffload = \"full\"\r\n\r\n[optim]\r\n");
  CHECK(migrated("x = 1\r\n\r\n[model.full_offload]\r\nnuma_bind = true\r\n") ==
        "x = 1\r\n\r\n[model]\r\noffload = \"full\"\r\n");
  CHECK(migrated("[model]\r\nname = \"m\"\r\n\r\n[model.full_offload]\r\n") ==
        "[model]\r\nname = \"m\"\r\noffload = \"full\"\r\n");
}

TEST_CASE("byte preservation: trailing whitespace, tabs, comments and unicode outside the edited lines") {
  const std::string head =
      "# Überblick — «config» 🚀   \n"
      "max_steps = 3\t\n"
      "\n"
      "[model]   # the model\n"
      "\tname = \"Qwen/Qwen3-0.6B — ✓\"  \n";
  const std::string tail =
      "   \n"
      "[optim] \n"
      "lr = 1e-4 # 学习率\n";
  CHECK(migrated(head + "\toptim_cpu_offload = true # ✓ keep\n" + tail) ==
        head + "\toffload = \"optimizer\" # ✓ keep\n" + tail);
}

TEST_CASE("byte preservation: a missing final newline stays missing") {
  CHECK(migrated("[model]\noptim_cpu_offload = false") == "[model]\noffload = \"none\"");
  CHECK(migrated("[model]\nname = \"m\"\nfsdp_cpu_offload = false") == "[model]\nname = \"m\"");
  CHECK(migrated("[model]\nname = \"m\"\n\n[model.full_offload]\nnuma_bind = true") ==
        "[model]\nname = \"m\"\noffload = \"full\"");
  CHECK(migrated("[model.full_offload]") == "[model]\noffload = \"full\"");
}

TEST_CASE("byte preservation: a byte order mark stays") {
  CHECK(migrated("\xEF\xBB\xBF[model]\noptim_cpu_offload = true\n") ==
        "\xEF\xBB\xBF[model]\noffload = \"optimizer\"\n");
}

TEST_CASE("blank lines: a removal does not leave two blank lines in a row") {
  CHECK(migrated("[model]\nname = \"m\"\n\nfsdp_cpu_offload = false\n\nseq_len = 8\n") ==
        "[model]\nname = \"m\"\n\nseq_len = 8\n");
  CHECK(migrated("[model]\nname = \"m\"\nfsdp_cpu_offload = false\n\nseq_len = 8\n") ==
        "[model]\nname = \"m\"\n\nseq_len = 8\n");
}

TEST_CASE("idempotence: migrating a migrated file changes nothing and says nothing") {
  const char* inputs[] = {
      "[model]\noptim_cpu_offload = false\nfull_offload = true\n",
      "model = { fsdp_cpu_offload = false, name = \"m\" }\n",
      "[model.optim_cpu_offload]\nfull = true\nnuma_bind = false\n",
      "[trainer.model]\ncp = 1\n[trainer.model.full_offload]\n",
      "trainer.model.optim_cpu_offload = true\r\n",
  };
  for (const char* in : inputs) {
    CAPTURE(in);
    std::string once = migrated(in);
    CHECK(once != in);
    auto twice = run(once);
    CHECK_FALSE(twice.changed());
    CHECK(twice.findings.empty());
  }
}
