"""chorus_fuzz_test: one fuzz target, two builds (docs/fuzzing.md).

In the default build it is a cc_test that replays the target's inputs in
fuzz/corpus/NAME and fuzz/regressions/NAME through LLVMFuzzerTestOneInput
(fuzz/replay_main.cc), so `bazel test //...` keeps fixed crashes fixed.
With --config=fuzz (clang, fuzz/run_fuzzers.sh) the same target links
libFuzzer's main instead and is run as a fuzzer.
"""

load("@rules_cc//cc:defs.bzl", "cc_test")

def chorus_fuzz_test(name, srcs, deps = [], tags = [], **kwargs):
    """A fuzz target NAME whose sources define LLVMFuzzerTestOneInput.

    Args:
      name: the target; its inputs are //fuzz:NAME_inputs.
      srcs: the sources (NAME.cc beside the code it fuzzes).
      deps: what they use.
      tags: extra tags; "fuzz_target" is always added (run_fuzzers.sh finds
        the targets by it).
      **kwargs: passed to cc_test (size, timeout, ...).
    """
    inputs = "//fuzz:%s_inputs" % name
    cc_test(
        name = name,
        srcs = srcs,
        args = ["$(rootpaths %s)" % inputs],
        data = [inputs],
        linkopts = select({
            "//fuzz:fuzzing": ["-fsanitize=fuzzer"],
            "//conditions:default": [],
        }),
        tags = tags + ["fuzz_target"],
        deps = deps + select({
            "//fuzz:fuzzing": [],
            "//conditions:default": ["//fuzz:replay_main"],
        }),
        **kwargs
    )
