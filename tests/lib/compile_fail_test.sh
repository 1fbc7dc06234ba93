#!/usr/bin/env bash
# A description of a field that does not exist, or a field left without one,
# must stop the build; the same struct described correctly must compile.
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
fi
if compile 'primecfg::field(&S::a, "A."), primecfg::field(&S::b, "B."), primecfg::field(&S::a, "Again.")'; then
  echo "FAIL: a field described twice compiled"; fail=1
fi
exit $fail
