"""The Python worker's load-time checks of a function's parameters against its bindings.

The worker (azure-functions-python-worker, `Registry.add_indexed_function` and
`validate_function_params`) refuses a function whose parameters and bindings disagree
before the host runs anything, with `FunctionLoadError: cannot load the X function: ...`.
The same checks run here, in the same order and with the worker's messages, so an app
the worker would refuse is refused at start, not once per request:

* an ``inout`` binding, a ``$return`` binding that is not ``out``;
* a parameter no binding names (``context`` excepted, which must then be annotated
  ``azure.functions.Context`` if annotated at all);
* a binding no parameter takes (a durable-client binding stacked on the wrong function);
* an ``Out[...]`` annotation on an input binding, or an output binding without one;
* an annotation the binding's converter does not accept (the library's binding registry,
  and the SDK-type bindings of ``azurefunctions-extensions-base``);
* a return annotation the ``$return`` binding cannot encode.

Annotations are resolved with ``typing.get_type_hints`` as the worker does: one that
cannot be resolved refuses the function too.
"""

from __future__ import annotations

import collections.abc
import inspect
import typing
from typing import Any

import azure.functions as func

from .errors import HostError

# The worker's BindingInfo directions (azure.functions.decorators.core.BindingDirection values).
IN, OUT, INOUT = 0, 1, 2


def _direction(binding: Any) -> int:
    d = binding.direction
    return int(getattr(d, "value", d))


class FunctionLoadError(HostError):
    """The worker's refusal of one function, with the worker's wording."""

    def __init__(self, function_name: str, msg: str) -> None:
        super().__init__(f"cannot load the {function_name} function: {msg}")


def _registry() -> Any:
    return func.get_binding_registry()


def _deferred_registry() -> Any:
    try:
        import azurefunctions.extensions.base as base
    except ImportError:  # the SDK-type bindings are optional, as in the worker
        return None
    return base.get_binding_registry()


class _Generic:
    """The worker's GenericBinding: what a binding type without a converter accepts."""

    @staticmethod
    def check_input_type_annotation(pytype: Any) -> bool:
        return isinstance(pytype, type) and issubclass(pytype, (str, bytes))

    @staticmethod
    def check_output_type_annotation(pytype: Any) -> bool:
        return isinstance(pytype, type) and issubclass(pytype, (str, bytes, bytearray))


def _binding(type_name: str, deferred: bool = False) -> Any:
    found = None
    if not deferred:
        found = _registry().get(type_name)
    else:
        reg = _deferred_registry()
        found = reg.get(type_name) if reg is not None else None
    return found or _Generic


def _has_implicit_output(type_name: str) -> bool:
    b = _binding(type_name)
    if b is _Generic:
        return type_name != "durableClient"
    return bool(getattr(b, "has_implicit_output", lambda: False)())


def _is_deferred(annotation: Any) -> bool:
    reg = _deferred_registry()
    try:
        return bool(reg is not None and reg.check_supported_type(annotation))
    except Exception:
        return False


def _is_out(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    target = origin if origin is not None else annotation
    return isinstance(target, type) and target.__name__ == "Out"


def _is_generic_alias(annotation: Any) -> bool:
    return typing.get_origin(annotation) is not None


def _settlement_param(
    params: dict[str, Any], bound: dict[str, Any], annotations: dict[str, Any]
) -> str | None:
    unbound = set(params) - set(bound)
    if len(unbound) != 1:
        return None
    pname = next(iter(unbound))
    reg = _deferred_registry()
    try:
        if reg is not None and reg.check_supported_grpc_client_type(annotations.get(pname)):
            return pname
    except Exception:
        return None
    return None


def _name(pytype: Any) -> str:
    return getattr(pytype, "__name__", repr(pytype))


def _check_input(type_name: str, pytype: Any, deferred: bool) -> bool:
    try:
        return bool(_binding(type_name, deferred).check_input_type_annotation(pytype))
    except TypeError:  # a generic alias where the converter calls issubclass
        return False


def _check_output(type_name: str, pytype: Any) -> bool:
    try:
        return bool(_binding(type_name).check_output_type_annotation(pytype))
    except TypeError:
        return False


def check_function(fn: Any) -> None:
    """Raise FunctionLoadError where the worker would refuse to load ``fn`` (a decorated
    function of ``app.get_functions()``)."""
    name = fn.get_function_name()
    user_fn = fn.get_user_function()
    params = dict(inspect.signature(user_fn).parameters)
    try:
        annotations = typing.get_type_hints(user_fn)
    except Exception as exc:
        raise FunctionLoadError(
            name, f"cannot resolve its annotations: {type(exc).__name__}: {exc}"
        ) from None

    bound: dict[str, Any] = {}
    explicit_return = False
    return_binding: str | None = None
    for b in fn.get_bindings():
        direction = _direction(b)
        if direction == INOUT:
            raise FunctionLoadError(name, '"inout" bindings are not supported')
        if b.name == "$return" and direction != OUT:
            raise FunctionLoadError(name, '"$return" binding must have direction set to "out"')
        if b.name == "$return":
            if not explicit_return:
                return_binding = b.type
            explicit_return = True
        else:
            bound[b.name] = b
            if _has_implicit_output(b.type) and not explicit_return:
                return_binding = b.type

    if "context" in params and "context" not in bound:
        params.pop("context")
        anno = annotations.get("context")
        if "context" in annotations and (not isinstance(anno, type) or anno.__name__ != "Context"):
            raise FunctionLoadError(
                name,
                'the "context" parameter is expected to be of type azure.functions.Context, '
                f"got {anno!r}",
            )

    if set(params) - set(bound):
        # The newer worker's settlement client: one unbound parameter annotated with an
        # SDK gRPC client type (ServiceBusMessageActions) is given by the worker.
        settlement = _settlement_param(params, bound, annotations)
        if settlement is not None:
            params.pop(settlement)
    if set(params) - set(bound):
        raise FunctionLoadError(
            name,
            "the following parameters are declared in Python but not in function.json: "
            f"{set(params) - set(bound)!r}",
        )
    if set(bound) - set(params):
        raise FunctionLoadError(
            name,
            "the following parameters are declared in function.json but not in Python: "
            f"{set(bound) - set(params)!r}",
        )

    for pname in params:
        b = bound[pname]
        has_anno = pname in annotations
        anno = annotations.get(pname)
        deferred = has_anno and _is_deferred(anno)
        param_out = has_anno and _is_out(anno)
        binding_out = _direction(b) == OUT
        if param_out:
            args = typing.get_args(anno)
            if len(args) != 1:
                raise FunctionLoadError(
                    name, f"binding {pname} has invalid Out annotation {anno!r}"
                )
            pytype = args[0]
        else:
            pytype = anno
        if has_anno and not isinstance(pytype, type) and not _is_generic_alias(pytype):
            raise FunctionLoadError(
                name, f"binding {pname} has invalid non-type annotation {anno!r}"
            )
        if binding_out and has_anno and not param_out:
            raise FunctionLoadError(
                name,
                f'binding {pname} is declared to have the "out" direction, but its annotation '
                "in Python is not a subclass of azure.functions.Out",
            )
        if not binding_out and param_out:
            raise FunctionLoadError(
                name,
                f'binding {pname} is declared to have the "in" direction in function.json, but '
                "its annotation is azure.functions.Out in Python",
            )
        if not has_anno:
            continue
        bind_type = (
            "generic" if pytype in (str, bytes) and not _has_implicit_output(b.type) else b.type
        )
        ok = (
            _check_output(bind_type, pytype)
            if param_out
            else _check_input(bind_type, pytype, deferred)
        )
        if not ok:
            raise FunctionLoadError(
                name,
                f'type of {pname} binding in function.json "{b.type}" does not match its '
                f'Python annotation "{_name(pytype)}"',
            )

    if explicit_return and "return" in annotations:
        ret = annotations["return"]
        if _is_out(ret):
            raise FunctionLoadError(name, "return annotation should not be azure.functions.Out")
        if not isinstance(ret, type):
            raise FunctionLoadError(name, f"has invalid non-type return annotation {ret!r}")
        if return_binding and not _check_output(return_binding, ret):
            raise FunctionLoadError(
                name,
                f'Python return annotation "{_name(ret)}" does not match binding type '
                f'"{return_binding}"',
            )


def is_iterable_of(annotation: Any, kind: type) -> bool:
    """``list[X]``/``typing.List[X]``/``Sequence[X]`` with X a subclass of ``kind``."""
    origin = typing.get_origin(annotation)
    if origin is None or not (
        isinstance(origin, type) and issubclass(origin, collections.abc.Iterable)
    ):
        return False
    args = typing.get_args(annotation)
    return len(args) == 1 and isinstance(args[0], type) and issubclass(args[0], kind)
