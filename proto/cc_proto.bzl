"""cc_grpc_library: C++ protobuf + gRPC code from the system protoc.

Bazel 4.2 offline has no usable proto rules, so a genrule calls Debian's
`protoc` with `grpc_cpp_plugin` and a cc_library wraps what it writes.
Proto paths are relative to this package, which is the import root: a file
proto/chorus/v1/job.proto is imported as "chorus/v1/job.proto" and its header
included as "chorus/v1/job.pb.h".
"""

def cc_grpc_library(name, srcs, grpc = True, deps = [], visibility = None):
    """Generates and compiles C++ code for `srcs`.

    Args:
      name: the cc_library's name.
      srcs: .proto files in this package; all files one of them imports must
        be listed too, in this target or compiled into one in `deps`.
      grpc: also generate service stubs.
      deps: other cc_grpc_library targets whose protos `srcs` import.
      visibility: of the cc_library.
    """
    outs_h = []
    outs_cc = []
    for src in srcs:
        if not src.endswith(".proto"):
            fail("cc_grpc_library %s: %s is not a .proto file" % (name, src))
        base = src[:-len(".proto")]
        outs_h.append(base + ".pb.h")
        outs_cc.append(base + ".pb.cc")
        if grpc:
            outs_h.append(base + ".grpc.pb.h")
            outs_cc.append(base + ".grpc.pb.cc")

    root = native.package_name() or "."
    grpc_flags = ""
    if grpc:
        grpc_flags = "--grpc_out=$(GENDIR)/{root} --plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin) ".format(root = root)
    native.genrule(
        name = name + "_codegen",
        srcs = srcs + [d + "_srcs" for d in deps],
        outs = outs_h + outs_cc,
        cmd = ("if ! command -v protoc >/dev/null; then echo 'protoc not found: run deploy/setup.sh' >&2; exit 1; fi; " +
               "protoc -I" + root + " --cpp_out=$(GENDIR)/" + root + " " + grpc_flags +
               " ".join([root + "/" + s for s in srcs])),
    )
    native.filegroup(
        name = name + "_srcs",
        srcs = srcs + [d + "_srcs" for d in deps],
    )
    native.cc_library(
        name = name,
        srcs = outs_cc,
        hdrs = outs_h,
        includes = ["."],
        copts = ["-w"],
        deps = deps + ["@system//:grpc"],
        visibility = visibility,
    )
