"""Convert's shortcuts give what the long way gave: numpy constant folding (FoldConstant's module),
shape inference without the weights (onnx's result), one onnxruntime session less in prepare, the
prefolded module shared by auto-fallback's candidates, and artifacts that load and match.

Functional only; the timings are benchmarks/convert_speed.py's."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from amptool import _tvm
from amptool.app.convert import ConvertConfig, build_model, rewrite_model, rewrite_with_policy
from amptool.colors import load_policy
from amptool.frontend import prepare
from amptool.frontend.fold import infer_shapes
from amptool.frontend.importer import import_model
from amptool.frontend.load import load_model
from amptool.frontend.signature import graph_inputs, pin_input_specs
from amptool.passes import fold_constants as fold_module
from amptool.passes.concretize_like import concretize_like
from amptool.passes.fold_casts import fold_constant_casts
from amptool.passes.fold_constants import fold_constants
from amptool.passes.mixed_precision import to_mixed_precision
from tests.conftest import export_packs_tvms_blob


def _imported(path: str):
    loaded = load_model(path)
    inputs = pin_input_specs(graph_inputs(loaded.model), {}, None)
    return import_model(prepare.prepare_model(loaded.model, inputs).model, inputs)


@pytest.mark.parametrize("name", ["tiny_cnn", "resnet_like", "transformer_encoder"])
def test_fold_constants_gives_fold_constants_module(zoo_model, name):
    imported = _imported(zoo_model(name))
    mod, _ = concretize_like(imported.mod, "float16")
    prefolded = _tvm.fold_constant(mod)
    tvm.ir.assert_structural_equal(fold_constants(mod), prefolded, map_free_vars=True)
    for dtype in ("float16", "bfloat16"):
        mixed, _ = to_mixed_precision(prefolded, load_policy(None), dtype, imported.provenance)
        cast = fold_constant_casts(mixed)  # the fold stage: casts first, as before
        tvm.ir.assert_structural_equal(fold_constants(cast), _tvm.fold_constant(cast), map_free_vars=True)


def _module(dataflow: bool, like: bool = False):
    """(x + reshape(permute(C))) * squeeze(C2) [+ zeros_like(x)], in or outside a dataflow block."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    weight = relax.const(np.arange(6, dtype="float32").reshape(3, 2))
    scale = relax.const(np.full((1, 3), 0.5, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow() if dataflow else contextlib.nullcontext():
            t = bb.emit(relax.op.permute_dims(weight))
            r = bb.emit(relax.op.reshape(t, (2, 3)))
            s = bb.emit(relax.op.squeeze(scale, [0]))
            y = bb.emit(relax.op.multiply(relax.op.add(x, r), s))
            if like:
                y = bb.emit(relax.op.add(y, relax.op.zeros_like(x)))
            if dataflow:
                y = bb.emit_output(y)
        bb.emit_func_output(y)
    return bb.get()


@pytest.mark.parametrize("dataflow", [True, False])
@pytest.mark.parametrize("like", [False, True])
def test_fold_constants_in_and_outside_dataflow(dataflow, like):
    mod = relax.transform.Normalize()(_module(dataflow, like))
    ours = fold_constants(mod)
    tvm.ir.assert_structural_equal(ours, _tvm.fold_constant(mod), map_free_vars=True)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    want = (x + np.arange(6, dtype="float32").reshape(3, 2).T.reshape(2, 3)) * np.float32(0.5)
    got = _tvm.run_vm(_tvm.vm_from_executable(tvm.compile(ours, target="llvm"), "cpu"), [x], "cpu")[0]
    np.testing.assert_array_equal(got, want)


def test_fold_constants_runs_tvm_only_when_something_is_left(monkeypatch):
    calls = []
    monkeypatch.setattr(fold_module._tvm, "fold_constant", lambda m: calls.append(m) or m)
    fold_constants(relax.transform.Normalize()(_module(dataflow=True)))
    assert calls == []  # everything folded in numpy
    fold_constants(relax.transform.Normalize()(_module(dataflow=True, like=True)))
    assert len(calls) == 1  # zeros_like(x) folds in TVM even with x unknown


def _index_module():
    """``x[where(i < 0, i + shape(x)[0], i)]`` (TVM's Gather of a constant index, as in each copy of
    an unrolled Loop) for i = 1 and -1, and more small arithmetic on constants: takes in clip and
    wrap modes, a comparison, maximum, an int32 sum that wraps, a cast, float32 products."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((5, 3), "float32"))

    def const(value, dtype="int64"):
        return relax.const(np.array(value, dtype), dtype)

    with bb.function("main", [x]):
        with bb.dataflow():
            rows = []
            for i in (1, -1):
                dims = bb.emit(relax.op.shape_to_tensor(bb.emit(relax.op.shape_of(x))))
                size = bb.emit(relax.op.take(dims, const(0), axis=0, mode="wrap"))
                index = bb.emit(relax.op.where(bb.emit(relax.op.less(const(i), const(0))),
                                               bb.emit(relax.op.add(const(i), size)), const(i)))
                rows.append(bb.emit(relax.op.take(x, index, axis=0)))
            ks = const([2, 7, -3])
            clipped = bb.emit(relax.op.take(const([0, 10, 20, 30]), ks, axis=0, mode="clip"))
            wrapped = bb.emit(relax.op.take(const([0, 10, 20, 30]), ks, axis=0, mode="wrap"))
            widest = bb.emit(relax.op.maximum(clipped, wrapped))
            wraps = bb.emit(relax.op.add(const([2**31 - 1], "int32"), const([1], "int32")))
            as_float = bb.emit(relax.op.astype(widest, "float32"))
            scaled = bb.emit(relax.op.multiply(as_float, relax.const(np.float32(0.1))))
            out = bb.emit_output(relax.Tuple([*rows, widest, wraps, scaled]))
        bb.emit_func_output(out)
    return relax.transform.Normalize()(bb.get())


def test_index_arithmetic_on_constants_folds_in_numpy_as_tvm_folds_it(monkeypatch):
    mod = _index_module()
    want = _tvm.fold_constant(mod)
    monkeypatch.setattr(fold_module._tvm, "fold_constant", lambda m: pytest.fail("TVM's FoldConstant ran"))
    ours = fold_constants(mod)
    tvm.ir.assert_structural_equal(ours, want, map_free_vars=True)
    names = [_tvm.op_name(call) for _gv, func in _tvm.relax_functions(ours) for call in _tvm.bound_calls(func)]
    assert names == ["relax.take", "relax.take"]  # only x's rows are left to compute


def _model_with_weights() -> onnx.ModelProto:
    weight = numpy_helper.from_array(np.ones((64, 128), np.float32), "w")
    shape = numpy_helper.from_array(np.array([2, -1], np.int64), "shape")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Reshape", ["y", "shape"], ["z"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)], [weight, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("data_prop", [False, True])
def test_infer_shapes_matches_onnx(data_prop):
    model = _model_with_weights()
    want = onnx.shape_inference.infer_shapes(model, data_prop=data_prop)
    got = infer_shapes(model, data_prop=data_prop)
    assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)
    assert [d.dim_value for d in got.graph.output[0].type.tensor_type.shape.dim] == [2, 256]
    np.testing.assert_array_equal(numpy_helper.to_array(got.graph.initializer[0]), np.ones((64, 128), np.float32))


@pytest.mark.parametrize("fixed", [False, True])
def test_prepare_reads_the_reference_from_the_folding_session(monkeypatch, fixed, onnxruntime_folding):
    model = _model_with_weights()
    model.graph.input.append(helper.make_tensor_value_info("unused", TensorProto.FLOAT, [1]))
    runs = []
    real_run = prepare._run
    monkeypatch.setattr(prepare, "_run", lambda m, feeds: runs.append(m) or real_run(m, feeds))
    inputs = pin_input_specs(graph_inputs(model), {}, None)
    fixed_inputs = {"unused": np.zeros(1, np.float32)} if fixed else {}
    inputs = [s for s in inputs if s.name not in fixed_inputs]
    prepared = prepare.prepare_model(model, inputs, fixed_inputs=fixed_inputs)
    assert "check-numerics" in prepared.steps
    assert len(runs) == (2 if fixed else 1)  # a graph changed before folding needs its own reference


def test_artifact_loads_and_matches_the_build(zoo_model, tmp_path):
    from amptool.app.artifact import load_artifact
    from amptool.app.convert import export_build

    build = build_model(ConvertConfig(model=zoo_model("resnet_like"), dtype="float16"))
    export_build(build, str(tmp_path / "out"))
    manifest, loaded = load_artifact(str(tmp_path / "out"))
    feeds = {s["name"]: np.random.default_rng(1).standard_normal(s["shape"]).astype("float32")
             for s in manifest["inputs"]}
    want = build.compiled().run(feeds)
    got = loaded.run(feeds)
    assert want.keys() == got.keys()
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])


def test_a_convert_releases_its_sources_once_the_manifest_is_made(zoo_model, tmp_path):
    """``convert_model`` drops the ONNX models and Relax modules before the export (whose
    serialisation then reuses their memory): the manifest is the one an export keeping them
    writes, the artifact computes the same."""
    from amptool.app.artifact import load_artifact
    from amptool.app.convert import convert_model, export_build

    config = ConvertConfig(model=zoo_model("resnet_like"), dtype="float16")
    kept = build_model(config)
    kept_manifest = export_build(kept, str(tmp_path / "kept"))
    released, manifest = convert_model(config, str(tmp_path / "released"))
    assert kept.prepared is not None and kept.passes.mod is not None and kept.loaded.model.graph.node
    assert released.prepared is None and released.passes.mod is None and not released.loaded.model.graph.node
    assert released.executable is not None and manifest["ops_by_dtype"]
    assert set(manifest["timings_s"]) == set(kept_manifest["timings_s"]) and manifest["timings_s"]["export"] > 0
    assert {k: v for k, v in manifest.items() if k != "timings_s"} == {
        k: v for k, v in kept_manifest.items() if k != "timings_s"}
    assert not _tvm.ir._CALLS_OF  # no look-up of a build stage still holds a module's functions (and weights)
    on_disk, loaded = load_artifact(str(tmp_path / "released"))
    assert on_disk == manifest
    feeds = {s["name"]: np.random.default_rng(2).standard_normal(s["shape"]).astype("float32")
             for s in manifest["inputs"]}
    want = kept.compiled().run(feeds)
    for name, value in loaded.run(feeds).items():
        np.testing.assert_array_equal(value, want[name])


def test_recolouring_reuses_the_prefolded_module(zoo_model):
    from amptool.app.fallback import with_fp32_nodes

    path = zoo_model("resnet_like")
    base = rewrite_model(ConvertConfig(model=path, dtype="float16"))
    node = next(n.name for n in base.prepared.graph.node if n.op_type == "Conv")
    again = rewrite_with_policy(base, ConvertConfig(model=path, dtype="float16"),
                                with_fp32_nodes(base.policy, [node]))
    assert again.passes.prefolded.same_as(base.passes.prefolded)
    assert "prefold" not in again.passes.timings_s and "prefold" in again.timings_s
    fresh = rewrite_model(ConvertConfig(model=path, dtype="float16", exclude_nodes=(node,)))
    tvm.ir.assert_structural_equal(again.passes.mod, fresh.passes.mod, map_free_vars=True)
    assert again.passes.weight_bytes == fresh.passes.weight_bytes


def test_kernels_built_in_parallel_match_one_build(zoo_model, tmp_path):
    from amptool.compiler import cpu, split_codegen

    config = ConvertConfig(model=zoo_model("transformer_encoder"), dtype="float16")
    target = _tvm.make_target({"kind": "llvm"})
    lowered = cpu.lower(rewrite_model(config).passes.mod, target)
    feeds = [np.arange(16, dtype="int64").reshape(1, 16) % 7, np.ones((1, 16), "int64")]

    def outputs(vm):
        return [np.asarray(o) for o in _tvm.run_vm(vm, feeds, "cpu")]

    serial = split_codegen.codegen(lowered, target, workers=1)
    split = split_codegen.codegen(lowered, target, workers=3)
    assert len(split.mod._collect_dso_modules()) == 3 and len(serial.mod._collect_dso_modules()) == 1
    want = outputs(_tvm.vm_from_executable(serial, "cpu"))
    _tvm.export_library(split, str(tmp_path / "split.so"))
    for got in (outputs(_tvm.vm_from_executable(split, "cpu")), outputs(_tvm.load_vm(str(tmp_path / "split.so")))):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("filled", [True, False])
def test_exported_library_carries_the_blob_tvm_would_pack(zoo_model, tmp_path, monkeypatch, filled):
    """The packed imports are written as our own ELF object, not through LLVM, with a hole the
    linked library's ``__tvm_ffi__library_bin`` is filled in (or, where that fails, the bytes in
    the object and linked again): it holds exactly TVM's serialisation, and TVM loads and runs it."""
    from amptool._tvm import elf

    if not filled:
        monkeypatch.setattr(elf, "fill_symbol", lambda *args: False)
    build = build_model(ConvertConfig(model=zoo_model("resnet_like"), dtype="float16"))
    executable = build.executable
    assert len(executable.mod._collect_dso_modules()) >= 2  # the parallel export, which packs this way
    path = str(tmp_path / "model.so")
    export_packs_tvms_blob(executable, path, monkeypatch)
    feeds = [np.random.default_rng(0).standard_normal(s.shape).astype("float32") for s in build.inputs]
    for got, expected in zip(_tvm.run_vm(_tvm.load_vm(path), feeds, "cpu"),
                             _tvm.run_vm(_tvm.vm_from_executable(executable, "cpu"), feeds, "cpu"), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_kernel_cache_builds_only_what_changed_and_computes_the_same(zoo_model):
    """Two probe-style builds sharing a KernelCache: the second compiles only the kernels its
    colours changed, runs the first build's compiled ones, and computes what a build without the
    cache computes."""
    from amptool.app.fallback import with_fp32_nodes
    from amptool.compiler import cpu
    from amptool.compiler.kernel_cache import KernelCache

    path = zoo_model("resnet_like")
    config = ConvertConfig(model=path, dtype="float16")
    base = rewrite_model(config)
    node = next(n.name for n in base.prepared.graph.node if n.op_type == "Conv")
    changed = rewrite_with_policy(base, config, with_fp32_nodes(base.policy, [node]))
    target = _tvm.make_target({"kind": "llvm"})
    cache = KernelCache()
    cpu.build(base.passes.mod, target, kernels=cache)
    first = cache.compiled
    assert first > 0 and cache.reused == 0
    executable = cpu.build(changed.passes.mod, target, kernels=cache)[0]
    assert cache.reused > 0 and 0 < cache.compiled - first < first  # some kernels changed, most did not
    fresh = cpu.build(changed.passes.mod, target)[0]
    feeds = [np.random.default_rng(0).standard_normal(s.shape).astype("float32") for s in changed.inputs]
    got = _tvm.run_vm(_tvm.vm_from_executable(executable, "cpu"), feeds, "cpu")
    want = _tvm.run_vm(_tvm.vm_from_executable(fresh, "cpu"), feeds, "cpu")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    reused = cache.reused
    cpu.build(changed.passes.mod, _tvm.make_target({"kind": "llvm", "mcpu": "x86-64-v2"}), kernels=cache)
    assert cache.reused == reused  # another target: nothing of the first one's is taken


def test_a_secondary_entry_compiles_its_own_kernels_quick_and_main_as_before(zoo_model):
    """Beside main, a probe copy's own kernels are compiled at -O0 (they only rank nodes); main's
    kernels stay -O3 (never taken from a quick compile) and compute what a plain build computes."""
    from amptool.app.probe import expose_bindings
    from amptool.compiler import cpu
    from amptool.compiler.kernel_cache import KernelCache

    rewritten = rewrite_model(ConvertConfig(model=zoo_model("resnet_like"), dtype="float16"))
    mod = rewritten.passes.mod
    names = [_tvm.var_name(b.var) for b in mod["main"].body.blocks[0].bindings][:6]
    probed = expose_bindings(mod, names, "main_probe")
    target = _tvm.make_target({"kind": "llvm"})
    cache = KernelCache()
    executable = cpu.build(probed, target, kernels=cache, secondary="main_probe")[0]
    quick = [c for entries in cache._kernels.values() for _, c in entries if c.quick]
    assert quick and len(quick) < cache.compiled
    feeds = [np.random.default_rng(0).standard_normal(s.shape).astype("float32") for s in rewritten.inputs]
    got = _tvm.run_vm(_tvm.vm_from_executable(executable, "cpu"), feeds, "cpu")
    want = _tvm.run_vm(_tvm.vm_from_executable(cpu.build(mod, target)[0], "cpu"), feeds, "cpu")
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _records(stack):
    return [(r.frame, r.filename, r.lineno, r.function, r.code_context, r.index) for r in stack]


def test_cheap_frame_stack_gives_inspects_records_and_restores_it():
    """Within ``cheap_frame_stack`` the records TVMScript reads are inspect's own, for every frame of
    this test's stack (pytest's included) and one whose file is no module's (the slow case: an
    import's frames, TVMScript's ``<ast>``); nested blocks leave inspect patched until the last exits."""
    import inspect
    import sys

    from amptool._tvm.script import cheap_frame_stack

    real_stack, real_outer = inspect.stack, inspect.getouterframes

    def both():
        here = sys._getframe()
        return ([_records(inspect.stack(3))[1:], _records(inspect.getouterframes(here))[1:]],
                [_records(real_stack(3))[1:], _records(real_outer(here))[1:]])

    namespace = {"both": both}
    exec(compile("def from_nowhere():\n    return both()\n", "<no module>", "exec"), namespace)
    with cheap_frame_stack():
        with cheap_frame_stack():
            cheap, real = namespace["from_nowhere"]()
        assert inspect.stack is not real_stack
    assert inspect.stack is real_stack and inspect.getouterframes is real_outer
    assert cheap == real
    assert len(cheap[0]) > 5 and cheap[0][0][1] == "<no module>" and cheap[0][0][4] is None
    assert cheap[0][1][4] is not None and len(cheap[0][1][4]) == 3  # this test's own line, in context


def _doubling_kernel(n: int):
    """``b = 2·a`` over ``n`` values, one block ``b``, parsed from TVMScript here and now."""
    from tvm.script import tirx as T

    @T.prim_func(private=True, s_tir=True)
    def scale(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")) -> None:
        for i in range(n):
            with T.sblock("b"):
                vi = T.axis.spatial(n, i)
                b[vi] = a[vi] * T.float32(2)

    return scale


def test_tvmscript_parses_the_same_under_cheap_frame_stack():
    from amptool._tvm.script import cheap_frame_stack

    want = _doubling_kernel(8)
    with cheap_frame_stack():
        got = _doubling_kernel(8)
    tvm.ir.assert_structural_equal(got, want)


def test_unchecked_schedules_skip_tvms_argument_checks_only_inside_the_block():
    """TVM checks each Schedule call's argument types in Python (0.43 s of a ResNet-50's 1.9 s
    compile stage); inside ``unchecked_schedules`` a call goes straight to the FFI, with the same
    result, and outside it the check is back (a wrong type raises TVM's TypeError again)."""
    from tvm import s_tir

    from amptool._tvm.schedule import unchecked_schedules

    scale = _doubling_kernel(64)

    def split(schedule):
        loop, = schedule.get_loops(schedule.get_sblock("b"))
        schedule.split(loop, [None, 16])
        return schedule.mod

    checked_split = s_tir.Schedule.split
    want = split(s_tir.Schedule(scale))
    with unchecked_schedules():
        with unchecked_schedules():
            assert s_tir.Schedule.split is checked_split.__wrapped__
        assert s_tir.Schedule.split is not checked_split
        got = split(s_tir.Schedule(scale))
    assert s_tir.Schedule.split is checked_split
    tvm.ir.assert_structural_equal(got, want)
    with pytest.raises(TypeError, match="Schedule.get_sblock"):
        s_tir.Schedule(scale).get_sblock(3.5)


def test_tvm_imports_without_torch_unless_torch_came_first(tmp_path):
    """tvm_ffi and tvm.relax import torch when it is installed (+2.7 s per command, measured);
    ``import amptool`` hides it from them, and a later ``import torch`` still works. A process
    that imported torch first keeps TVM's torch support (nothing is hidden)."""
    fake = tmp_path / "site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("IMPORTS = 1\n")
    probe = (
        "import sys\n"
        "if sys.argv[1] == 'torch-first':\n"
        "    import torch\n"
        "    import amptool, amptool._without_torch as w\n"
        "    print('hiding', w._FINDER in sys.meta_path)\n"
        "    raise SystemExit\n"
        "import amptool, tvm, tvm.relax, tvm_ffi._convert as c\n"
        "print('during', 'torch' in sys.modules, c.torch is not None)\n"
        "import torch\n"
        "print('after', torch.IMPORTS)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{os.getcwd()}"}

    def run(order: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", probe, order], capture_output=True, text=True, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.splitlines()

    assert run("amptool-first") == ["during False False", "after 1"]
    assert run("torch-first") == ["hiding False"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_cli_process_reuses_freed_memory_instead_of_faulting_fresh_pages():
    """A 64 MB block freed and allocated again: glibc by default unmaps it and the second one faults
    in every page afresh (~16k minor faults); after the CLI's ``_keep_freed_memory`` it is reused."""
    probe = (
        "import resource, sys\n"
        "from amptool.cli import main\n"
        "if sys.argv[1] == 'cli':\n"
        "    main._keep_freed_memory()\n"
        "block = bytearray(64 << 20); del block\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "block = bytearray(64 << 20)\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )

    def faults(mode: str) -> int:
        done = subprocess.run([sys.executable, "-c", probe, mode], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.strip())

    pages = (64 << 20) // os.sysconf("SC_PAGE_SIZE")
    default = faults("default")
    if default < pages // 2:  # transparent huge pages for every mapping: fresh memory is cheap here
        pytest.skip(f"a fresh 64 MB block faulted {default} times, not once per page")
    assert faults("cli") < pages // 20


def test_function_names_listed_once_per_change_while_tvm_imports():
    """TVM's ~50 ``_ffi_api`` modules each list every global function name at import, one FFI call
    per name (each a GIL hand-off: a background import beside a busy thread took seconds). Inside
    ``tvm_module``'s block the list is kept while the number of functions stays the same, and a
    function registered meanwhile is listed."""
    import tvm_ffi
    import tvm_ffi.registry as registry

    from amptool._tvm.common import _CACHED_FUNCTION_NAMES

    original = registry.list_global_func_names
    want = original()
    with _CACHED_FUNCTION_NAMES.block():
        assert registry.list_global_func_names is not original
        first = registry.list_global_func_names()
        assert first == want and registry.list_global_func_names() == want
        first.append("mutating a returned list changes no later answer")
        assert registry.list_global_func_names() == want
        name = f"amptool.test.listed_{os.getpid()}"
        tvm_ffi.register_global_func(name, lambda: 1)
        try:
            assert name in registry.list_global_func_names()
        finally:
            registry.remove_global_func(name)
    assert registry.list_global_func_names is original


_TVM_REGISTRY_STATE = """
import json, sys
import amptool._without_torch  # noqa: F401
if sys.argv[1] == "amptool":
    from amptool._tvm.common import tvm_module
    tvm = tvm_module()
else:
    import tvm
    from tvm import relax  # noqa: F401
import tvm_ffi
ops = sorted(str(n) for n in tvm.ir.Op.list_op_names())
attrs = {}
for name in ops:
    op = tvm.ir.Op.get(name)
    for key in ("TScriptPrinterName", "TCallEffectKind", "TIRxOpCategory", "TDeviceIntrinsicNamespace", "FLegalize"):
        if op.has_attr(key):
            value = op.get_attr(key)
            attrs[name + "/" + key] = value if isinstance(value, (str, int)) else type(value).__name__
print(json.dumps({"ops": ops, "attrs": attrs,
                  "types": sorted(str(k) for k in tvm_ffi.get_global_func("ffi.GetRegisteredTypeKeys")()),
                  "disco": repr(tvm.runtime.disco),
                  "ir_functions": [type(getattr(tvm.ir._ffi_api, f)).__name__ for f in ("GetOp", "RegisterOpAttr")]}))
"""


def test_tvm_imported_without_cpp_errors_registers_what_tvms_own_import_does():
    """``tvm_module`` answers the unknown type keys and operator names TVM's import asks for, and a
    printer name set again, without C++ errors (each collects a backtrace: 0.3 s of the import).
    The operators, their attributes and the object types end as TVM's own import leaves them, and
    TVM's own functions are back in ``tvm.ir._ffi_api`` afterwards."""
    import json

    def state(mode: str) -> dict:
        done = subprocess.run([sys.executable, "-c", _TVM_REGISTRY_STATE, mode], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout)

    ours, tvms = state("amptool"), state("tvm")
    assert len(tvms["ops"]) > 500 and len(tvms["attrs"]) > 1000
    assert ours == tvms
    assert ours["ir_functions"] == ["Function", "Function"]


def test_unknown_type_keys_are_answered_without_asking_cpp():
    """A type key no loaded library registered is None from the registered keys' list; a known one,
    or one registered after the list was read, is C++'s own answer."""
    from types import SimpleNamespace

    from amptool._tvm.common import _type_indices_without_errors

    registered = ["ir.IRModule"]
    asked: list[str] = []

    def from_cpp(key: str) -> int:
        asked.append(key)
        return 7

    core = SimpleNamespace(_object_type_key_to_index=from_cpp,
                           _get_global_func=lambda name, allow_missing: lambda: list(registered))
    lookup = _type_indices_without_errors(core)["_object_type_key_to_index"]
    assert lookup("runtime.disco.DRef") is None and asked == []
    assert lookup("ir.IRModule") == 7 and asked == ["ir.IRModule"]
    registered.append("relax.Later")
    assert lookup("relax.Later") == 7 and asked[-1] == "relax.Later"
    assert _type_indices_without_errors(SimpleNamespace(_object_type_key_to_index=from_cpp,
                                                        _get_global_func=lambda name, allow_missing: None)) == {}


def test_missing_operators_and_repeated_printer_names_raise_without_asking_cpp():
    """Inside TVM's import, ``ir.GetOp`` of an unregistered name and ``ir.RegisterOpAttr`` of a string
    an operator already has raise AttributeError in Python; everything else reaches C++, and an
    operator C++ creates by registering an attribute is known afterwards."""
    from types import SimpleNamespace

    from amptool._tvm.common import _op_registry_without_errors

    ops: dict[str, dict[str, object]] = {"tirx.add": {"TScriptPrinterName": "T.add"}}
    calls: list[tuple] = []

    def get_op(name: str) -> str:
        calls.append(("GetOp", name))
        if name not in ops:
            raise AttributeError(f"Check failed: Operator {name} is not registered")
        return name

    def register_op_attr(name: str, key: str, value: object, level: int) -> None:
        calls.append(("RegisterOpAttr", name, key, value, level))
        ops.setdefault(name, {})[key] = value

    functions = {"ir.GetOp": get_op, "ir.RegisterOpAttr": register_op_attr, "ir.ListOpNames": lambda: list(ops),
                 "ir.OpHasAttr": lambda op, key: key in ops[op], "ir.OpGetAttr": lambda op, key: ops[op][key]}
    registry = SimpleNamespace(get_global_func=lambda name, allow_missing=False: functions.get(name))
    get_global_func = _op_registry_without_errors(registry)["get_global_func"]
    looked_up, set_attr = get_global_func("ir.GetOp"), get_global_func("ir.RegisterOpAttr")
    assert looked_up.__wrapped__ is get_op and set_attr.__wrapped__ is register_op_attr
    assert get_global_func("ir.OpHasAttr") is functions["ir.OpHasAttr"]

    with pytest.raises(AttributeError, match="tirx.nki.store is not registered"):
        looked_up("tirx.nki.store")
    assert looked_up("tirx.add") == "tirx.add"
    assert calls == [("GetOp", "tirx.add")]
    with pytest.raises(AttributeError, match="already registered"):
        set_attr("tirx.add", "TScriptPrinterName", "T.add", 20)
    set_attr("tirx.add", "TScriptPrinterName", "T.plus", 20)
    set_attr("tirx.new", "TScriptPrinterName", "T.new", 20)
    assert [c for c in calls if c[0] == "RegisterOpAttr"] == [
        ("RegisterOpAttr", "tirx.add", "TScriptPrinterName", "T.plus", 20),
        ("RegisterOpAttr", "tirx.new", "TScriptPrinterName", "T.new", 20)]
    assert looked_up("tirx.new") == "tirx.new"


def test_a_rodata_hole_is_filled_in_the_linked_library_only_where_it_fits(tmp_path):
    """``write_rodata_object(hole=True)`` lays out the object as with the bytes, zeros where they
    go; ``fill_symbol`` writes the bytes over the linked symbol, and refuses (writing nothing) a
    symbol of another size or one the library lacks."""
    from tvm.support import cc

    from amptool._tvm import elf

    machine = elf.host_machine()
    if machine is None:
        pytest.skip("the ELF writer is used on Linux x86-64/AArch64 only")
    data = np.random.default_rng(5).integers(0, 256, 100_003, dtype=np.uint8)
    dense, sparse = tmp_path / "dense.o", tmp_path / "sparse.o"
    with open(dense, "wb") as handle:
        elf.write_rodata_object(handle, "amptool_test_blob", data.data, machine)
    with open(sparse, "wb") as handle:
        elf.write_rodata_object(handle, "amptool_test_blob", data.data, machine, hole=True)
    dense_bytes, sparse_bytes = dense.read_bytes(), sparse.read_bytes()
    at = dense_bytes.find(data.tobytes())
    assert len(sparse_bytes) == len(dense_bytes) and at > 0
    assert sparse_bytes[at:at + data.nbytes] == bytes(data.nbytes)
    assert sparse_bytes[:at] == dense_bytes[:at] and sparse_bytes[at + data.nbytes:] == dense_bytes[at + data.nbytes:]

    library = tmp_path / "blob.so"
    cc.create_shared(str(library), [str(sparse)])
    before = library.read_bytes()
    assert not elf.fill_symbol(str(library), "amptool_test_blob", data[:-1].data)
    assert not elf.fill_symbol(str(library), "no_such_symbol", data.data)
    assert library.read_bytes() == before
    assert elf.fill_symbol(str(library), "amptool_test_blob", data.data)
    start = ctypes.addressof(ctypes.c_char.in_dll(ctypes.CDLL(str(library)), "amptool_test_blob"))
    assert ctypes.string_at(start, data.nbytes) == data.tobytes()


_WITHOUT_BACKENDS = """
import os, sys
import numpy as np
import amptool._without_torch  # noqa: F401
from amptool._tvm import common
if sys.argv[1] == "cpu-only":
    common.without_device_backends()
tvm = common.tvm_module()
from tvm.backend import loader
from amptool.app.convert import ConvertConfig, build_model
build = build_model(ConvertConfig(model=sys.argv[2], dtype="float16"))
x = np.random.default_rng(0).standard_normal(build.inputs[0].shape).astype("float32")
out = build.compiled().run({build.inputs[0].name: x})
print(loader.is_loaded("cuda"), loader.is_loaded("vulkan"), "TVM_DEVICE_BACKEND_AUTOLOAD" in os.environ,
      float(np.abs(next(iter(out.values()))).sum()))
"""


def test_a_cpu_only_process_imports_tvm_without_device_backends(zoo_model):
    """``without_device_backends`` (the CLI's llvm convert) has TVM's import skip its device backends'
    Python, TVM's own ``TVM_DEVICE_BACKEND_AUTOLOAD=0`` set only while it imports; the CPU build
    computes what a process with every backend computes."""
    def run(mode: str) -> list[str]:
        done = subprocess.run([sys.executable, "-c", _WITHOUT_BACKENDS, mode, zoo_model("resnet_like")],
                              capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                                     if k != "TVM_DEVICE_BACKEND_AUTOLOAD"})
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.split()

    skipped, loaded = run("cpu-only"), run("every")
    assert skipped[:3] == ["False", "False", "False"] and loaded[:3] == ["True", "True", "False"]
    assert skipped[3] == loaded[3]


def test_the_cli_converts_for_llvm_without_device_backends(zoo_model, tmp_path, monkeypatch):
    """Only an llvm convert, or a diff that builds for llvm here, asks for the CPU-only import (a CUDA
    or Vulkan build needs its backend, and so may an artifact or a remote device)."""
    from click.testing import CliRunner

    from amptool._tvm import common
    from amptool.cli.main import cli

    asked: list[str] = []
    monkeypatch.setattr(common, "without_device_backends", lambda: asked.append("cpu-only"))
    for target, want in (("llvm", ["cpu-only"]), ("cuda", [])):
        asked.clear()
        CliRunner().invoke(cli, ["convert", zoo_model("resnet_like"), "--target", target, "--lower-only",
                                 "-o", str(tmp_path / target), "-q"])
        assert asked == want
    asked.clear()
    CliRunner().invoke(cli, ["diff", zoo_model("resnet_like"), "-q"])
    assert asked == ["cpu-only"]
    asked.clear()
    CliRunner().invoke(cli, ["diff", zoo_model("resnet_like"), "--artifact", str(tmp_path / "none"), "-q"])
    assert asked == []


def test_arithmetic_numpy_would_do_otherwise_is_left_to_tvm():
    """bool sums (numpy's is an or), mixed dtypes (numpy promotes), out-of-range "fast" takes."""
    yes = np.array([True])
    assert fold_module._evaluate(None, "relax.add", [yes, yes]) is None
    assert fold_module._evaluate(None, "relax.negative", [yes]) is None
    assert fold_module._evaluate(None, "relax.add", [np.array([1], "int32"), np.array([1], "int64")]) is None
    assert fold_module._evaluate(None, "relax.less", [yes, yes]).tolist() == [False]
    fast = relax.op.take(relax.Var("v", relax.TensorType((3,), "int64")), relax.const(0, "int64"), mode="fast")
    assert fold_module._evaluate(fast, "relax.take", [np.arange(3), np.array(3)]) is None
    assert fold_module._evaluate(fast, "relax.take", [np.arange(3), np.array(2)]) == 2
