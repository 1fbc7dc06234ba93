#!/usr/bin/env bash
# A description of a field that does not exist, or a field left without one,
# must stop the build; the same struct described correctly must compile. The
# messages name what is wrong: the undescribed field, a config struct that is
# no aggregate, a rule that names a temporary.
set -u
cxx=$1
root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

compile() {  # compile FIELDS_EXPRESSION
  cat >"$tmp/t.cpp" <<CPP
#include <primecfg/describe.hpp>
struct S {
  int a = 1;
  double b = 2.0;
  static constexpr auto fields() { return primecfg::describe($1); }
};
int main() { return static_cast<int>(primecfg::doc_of<S>.fields[0].description.size()); }
CPP
  "$cxx" -std=c++20 -fsyntax-only -I"$root/include" "$tmp/t.cpp" 2>"$tmp/err.txt"
}

fail=0
if ! compile 'primecfg::field(&S::a, "A."), primecfg::field(&S::b, "B.")'; then
  echo "FAIL: a fully described struct did not compile:"; cat "$tmp/err.txt"; fail=1
fi
if compile 'primecfg::field(&S::a, "A."), primecfg::field(&S::c, "No such field.")'; then
  echo "FAIL: a description of a missing field compiled"; fail=1
fi
if compile 'primecfg::field(&S::a, "A.")'; then
  echo "FAIL: a struct with an undescribed field compiled"; fail=1
elif ! grep -q "every field needs exactly one" "$tmp/err.txt"; then
  echo "FAIL: the undescribed field did not produce primecfg's message:"; cat "$tmp/err.txt"; fail=1
elif ! grep -q 'Field = .*name_literal<1>{"b"}; FieldType = double; .*Index = 1; int Entries = 0' "$tmp/err.txt"; then
  echo "FAIL: the message does not name the undescribed field b (index 1, double):"; cat "$tmp/err.txt"; fail=1
fi
if compile 'primecfg::field(&S::a, "A."), primecfg::field(&S::b, "B."), primecfg::field(&S::a, "Again.")'; then
  echo "FAIL: a field described twice compiled"; fail=1
fi

# A program whose compilation must fail with primecfg's message.
expect_message() {  # expect_message WHAT MESSAGE <<CPP
  cat >"$tmp/m.cpp"
  if "$cxx" -std=c++20 -fsyntax-only -I"$root/include" "$tmp/m.cpp" 2>"$tmp/err.txt"; then
    echo "FAIL: $1 compiled"; fail=1
  elif ! grep -qF -- "$2" "$tmp/err.txt"; then
    echo "FAIL: $1 did not say '$2':"; head -c 4000 "$tmp/err.txt"; fail=1
  fi
}
aggregate="primecfg: a config struct must be an aggregate"
expect_message "a root with a constructor" "$aggregate" <<'CPP'
#include <primecfg/load.hpp>
struct Root {
  Root() {}
  int a = 1;
};
int main() { return primecfg::load<Root>({}).ok(); }
CPP
expect_message "a root with a private field" "$aggregate" <<'CPP'
#include <primecfg/load.hpp>
class Root {
  int a = 1;
 public:
  int b = 2;
};
int main() { return primecfg::load<Root>({}).ok(); }
CPP
expect_message "a section with a constructor" "$aggregate" <<'CPP'
#include <primecfg/load.hpp>
struct Section {
  explicit Section(int x = 1) : a(x) {}
  int a;
};
struct Root {
  Section section{};
};
int main() { return primecfg::load<Root>({}).ok(); }
CPP
if ! grep -q "with T = Section" "$tmp/err.txt"; then
  echo "FAIL: the message does not name the section's type:"; head -c 4000 "$tmp/err.txt"; fail=1
fi
expect_message "a rule that names a temporary" "not a temporary or a computed value" <<'CPP'
#include <primecfg/load.hpp>
struct Root {
  int a = 1;
  void validate(primecfg::validation& v) { v.error(a + 1, "too big"); }
};
int main() { return primecfg::load<Root>({}).ok(); }
CPP
exit $fail
