// machine-facts: prints the facts of this machine that change benchmark
// results (common/machine_facts.h), for the benchmark scripts.
//
//   bazel run //common:machine-facts   # cores=2 page_reporting_order=9 ...
#include <iostream>

#include "common/machine_facts.h"

int main() {
  std::cout << chorus::ReadMachineFacts().ToString() << std::endl;
  return 0;
}
