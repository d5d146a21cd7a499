"""Every version-sensitive Apache TVM call lives here (measured on apache-tvm 0.27.0.post1).

TVM's Python API moved a lot between 0.19 and 0.27 (Relay removed, ``struct_info`` became
``ty``, ``tir`` became ``tirx``, targets must be dicts). Keeping the calls in one package means
an upgrade touches one place. TVM is imported lazily so ``amptool --help`` stays instant.
Callers use ``from amptool import _tvm`` and ``_tvm.NAME``; the parts:

  common    the lazy import, native-stderr silencing, global-function lookups
  ir        Relax types, constants, op names, passes, rebuilding calls (the pass's hot path)
  build     targets, exported libraries, LLVM/toolchain facts (the pipelines: amptool.compiler)
  runtime   devices, the VM, thread pools — all of it works under a runtime-only TVM
  (amptool._without_torch keeps tvm_ffi from importing PyTorch at TVM's import; installed by
  ``import amptool``, it cannot live here: importing this package costs ~0.1 s)
  rpc       TVM's RPC client: tracker/server sessions, uploads, a remote VM (imported by its module path
            ``amptool._tvm.rpc``, only where a remote is used)
"""

from __future__ import annotations

from amptool._tvm.build import (  # noqa: F401
    count_prim_funcs,
    cpuinfo_field,
    export_library,
    host_cpu,
    host_feature_corrections,
    llvm_cpu_features,
    llvm_is_valid_cpu,
    llvm_unknown_features,
    make_target,
    system_triple,
    toolchain_versions,
    versions,
)
from amptool._tvm.common import (  # noqa: F401
    FLOAT_DTYPES,
    has_global_func,
    import_in_background,
    quiet_native_stderr,
    tvm_module,
)
from amptool._tvm.ir import (  # noqa: F401
    OUT_DTYPE_OPS,
    any_call,
    array_items,
    assert_well_formed,
    astype,
    attrs_dict,
    bound_calls,
    call_with_args,
    call_with_out_dtype,
    calls_op,
    constant_numpy,
    constant_view,
    dataflow_scoped_mutator,
    dims,
    fold_constant,
    forget_calls,
    is_constant,
    is_inf,
    is_nan,
    is_tuple_expr,
    is_tuple_type,
    module_script,
    new_var,
    op_name,
    registered_relax_ops,
    relax_functions,
    rewrite_functions,
    static_shape,
    tensor_dtype,
    var_binding,
    var_name,
    var_uses,
)
from amptool._tvm.runtime import (  # noqa: F401
    cuda_compute_version,
    device_info,
    error_line,
    load_vm,
    num_threads,
    open_device,
    prepared_call,
    run_vm,
    runtime_only,
    set_num_threads,
    vm_from_executable,
)
