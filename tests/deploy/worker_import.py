"""Index function_app.py the way the Python worker does on Flex Consumption,
in a bare interpreter (a fresh venv: the standard library and nothing else).

    python worker_import.py WORKER_DEPS APP_DIR ISOLATE

WORKER_DEPS holds the packages the worker ships (its declared protobuf,
grpcio, azure-functions pins), APP_DIR the deployed package with the remote
build's APP_DIR/.python_packages/lib/site-packages. ISOLATE is the value of
PYTHON_ISOLATE_WORKER_DEPENDENCIES (1 or 0).

The steps follow the worker for Python <= 3.12
(workers/azure_functions_worker/utils/dependency.py, DependencyManager, and
the placeholder specialisation of dispatcher.py):

1. A placeholder starts the worker before any app is mounted: the worker's
   directory is first on sys.path and the worker imports grpc, protobuf and
   azure.functions from it (use_worker_dependencies).
2. Specialisation (FunctionEnvironmentReloadRequest) mounts the app.
   Isolation on: prioritize_customer_dependencies removes the worker's
   directory from sys.path, drops every module loaded from it, and orders
   sys.path app packages, worker directory, app directory. Isolation off
   (the default on 3.11): reload_azure_google_namespace_from_worker_deps only
   reloads the `azure` and `google` namespaces, so the protobuf and grpc the
   worker imported stay in sys.modules.
3. Indexing imports function_app and asks the FunctionRegister it defines for
   its functions; an SDK-type binding's annotation must be registered with
   azurefunctions.extensions.base, or the worker refuses the function.

Prints one JSON line: the function names and where protobuf and grpc came
from, or the error the import raised (the worker logs it and indexes nothing).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback
import typing


def _clear_modules_under(path: str) -> None:
    for name, module in list(sys.modules.items()):
        if name in sys.builtin_module_names:
            continue
        paths = set(getattr(module, "__path__", None) or [])
        if getattr(module, "__file__", None):
            paths.add(module.__file__)
        if any(str(p).startswith(path) for p in paths):
            del sys.modules[name]
    sys.path_importer_cache.pop(path, None)


def main(worker_deps: str, app_dir: str, isolate: bool) -> dict:
    cx_deps = os.path.join(app_dir, ".python_packages", "lib", "site-packages")
    # 1. The placeholder: the worker's own packages.
    sys.path.insert(0, worker_deps)
    import azure.functions
    import google.protobuf
    import grpc

    worker = {
        "protobuf": google.protobuf.__version__,
        "grpc": grpc.__version__,
        "azure.functions": azure.functions.__version__,
    }
    # 2. Specialisation.
    os.environ["AzureWebJobsScriptRoot"] = app_dir  # noqa: SIM112 - the host's own spelling
    if isolate:
        sys.path.remove(worker_deps)
        _clear_modules_under(worker_deps)
        sys.path.insert(0, cx_deps)
        sys.path.append(worker_deps)
        sys.path.append(app_dir)
    else:
        sys.path.remove(worker_deps)
        sys.path[:0] = [cx_deps, worker_deps]
        sys.path.append(app_dir)
        for namespace in ("azure", "google"):
            importlib.reload(sys.modules[namespace])
        importlib.reload(sys.modules["azure.functions"])
    os.chdir(app_dir)
    # 3. Indexing.
    try:
        module = importlib.import_module("function_app")
        import azure.functions as func

        registers = [v for v in vars(module).values() if isinstance(v, func.FunctionRegister)]
        if len(registers) != 1:
            raise RuntimeError(f"function_app defines {len(registers)} FunctionRegister objects")
        functions = registers[0].get_functions()
        from azurefunctions.extensions.base import meta

        registry = meta.get_binding_registry()
        sdk_bindings: dict[str, list[str]] = {}
        service_bus_triggers = []
        for fn in functions:
            # The worker reads annotations with typing.get_type_hints (the
            # modules use `from __future__ import annotations`).
            hints = typing.get_type_hints(fn.get_user_function())
            for binding in fn.get_bindings():
                if binding.type == "serviceBusTrigger":
                    service_bus_triggers.append(fn.get_function_name())
                annotation = hints.get(binding.name)
                if (
                    annotation is not None
                    and registry is not None
                    and registry.check_supported_type(annotation)
                ):
                    sdk_bindings.setdefault(fn.get_function_name(), []).append(binding.type)
        names = sorted(fn.get_function_name() for fn in functions)
    except Exception as error:  # noqa: BLE001 - reported to the test, as the worker logs it
        return {
            "worker": worker,
            "error": f"{type(error).__name__}: {error}",
            "traceback": traceback.format_exc()[-3000:],
        }
    import google.protobuf as protobuf_now
    import grpc as grpc_now

    return {
        "worker": worker,
        "functions": names,
        "sdk_bindings": sdk_bindings,
        "service_bus_triggers": sorted(service_bus_triggers),
        "protobuf": {"version": protobuf_now.__version__, "file": protobuf_now.__file__},
        "grpc": {"version": grpc_now.__version__, "file": grpc_now.__file__},
    }


if __name__ == "__main__":
    result = main(sys.argv[1], sys.argv[2], sys.argv[3] == "1")
    sys.stdout.write("\n" + json.dumps(result) + "\n")
