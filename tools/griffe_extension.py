"""What griffe cannot see statically in dispatch_async, for the API reference (mkdocs.yml).

- An attrs class's ``__init__`` is made by attrs at import time: it is rebuilt here from
  the fields, as griffe's own extension does for dataclasses.
- `DispatchClient`'s ``send_template = _blocking(DispatchSession.send_template)`` and its
  kin are assignments: each becomes a method with the session method's parameters and
  docstring, and the return type the wrapper's annotation gives.

tests/test_docs_site.py compares every rendered signature with the runtime's.
"""

from __future__ import annotations

from typing import Any

import griffe

_ATTRS = {"attrs.frozen", "attrs.define", "attrs.mutable", "attr.s", "attr.attrs"}
_FIELD = {"attrs.field", "attr.ib", "attr.attrib"}
_TWIN_MAKERS = {"_blocking", "_iterating"}
_SELF = griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)


class DispatchReference(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for cls in _classes(pkg):
            if "__init__" not in cls.members and _is_attrs(cls):
                _set_attrs_init(cls)
            for name, member in list(cls.members.items()):
                if isinstance(member, griffe.Attribute) and (twin := _twin(pkg, member)):
                    cls.set_member(name, twin)


def _classes(obj: griffe.Module | griffe.Class) -> list[griffe.Class]:
    found: list[griffe.Class] = []
    for member in obj.members.values():
        if not member.is_alias and isinstance(member, griffe.Module | griffe.Class):
            if isinstance(member, griffe.Class):
                found.append(member)
            found.extend(_classes(member))
    return found


def _is_attrs(cls: griffe.Class) -> bool:
    return any(
        isinstance(d.value, griffe.Expr) and d.value.canonical_path in _ATTRS
        for d in cls.decorators
    )


def _set_attrs_init(cls: griffe.Class) -> None:
    positional: list[griffe.Parameter] = []
    keyword: list[griffe.Parameter] = []
    for member in cls.members.values():
        if not isinstance(member, griffe.Attribute) or member.annotation is None:
            continue
        if "instance-attribute" not in member.labels:
            continue  # a ClassVar
        value = member.value
        field: dict[str, Any] = {}
        if isinstance(value, griffe.ExprCall) and value.canonical_path in _FIELD:
            field = {a.name: a.value for a in value.arguments if isinstance(a, griffe.ExprKeyword)}
            value = field.get("default")
        if str(field.get("init")) == "False":
            continue
        if "factory" in field:
            factory = field["factory"]
            # A named factory reads as a call (dict()); a lambda's body would show
            # private helpers, so it reads as "some default", as in a stub.
            named = isinstance(factory, griffe.ExprName | griffe.ExprAttribute)
            value = griffe.ExprCall(factory, []) if named else "..."
        parameter = griffe.Parameter(
            str(field.get("alias") or member.name.lstrip("_")).strip("'\""),
            annotation=member.annotation,
            kind=griffe.ParameterKind.keyword_only
            if str(field.get("kw_only")) == "True"
            else griffe.ParameterKind.positional_or_keyword,
            default=value,
            docstring=member.docstring,
        )
        (keyword if parameter.kind is griffe.ParameterKind.keyword_only else positional).append(
            parameter
        )
    init = griffe.Function(
        "__init__",
        lineno=0,
        endlineno=0,
        parent=cls,
        parameters=griffe.Parameters(_SELF, *positional, *keyword),
        returns="None",
    )
    cls.set_member("__init__", init)


def _twin(pkg: griffe.Module, attribute: griffe.Attribute) -> griffe.Function | None:
    """The method that ``name = _blocking(Class.method)`` (or ``_iterating``) makes."""
    call = attribute.value
    if not (
        isinstance(call, griffe.ExprCall)
        and isinstance(call.function, griffe.ExprName)
        and call.function.name in _TWIN_MAKERS
        and len(call.arguments) == 1
        and isinstance(call.arguments[0], griffe.Expr)
    ):
        return None
    wrapped = pkg.modules_collection[call.arguments[0].canonical_path]
    maker = pkg.modules_collection[call.function.canonical_path]
    # The maker returns Callable[Concatenate[Client, P], R]; R = T is the wrapped one's.
    returns = maker.returns.slice.elements[-1]
    if str(returns) == "T":
        returns = wrapped.returns
    twin = griffe.Function(
        attribute.name,
        lineno=attribute.lineno,
        endlineno=attribute.endlineno,
        parent=attribute.parent,
        parameters=griffe.Parameters(
            *(
                griffe.Parameter(p.name, annotation=p.annotation, kind=p.kind, default=p.default)
                for p in wrapped.parameters
            )
        ),
        returns=returns,
    )
    if wrapped.docstring is not None:
        twin.docstring = griffe.Docstring(
            wrapped.docstring.value,
            parent=twin,
            parser=wrapped.docstring.parser,
            parser_options=wrapped.docstring.parser_options,
        )
    return twin
