"""The abstract interpreter over parser-building functions: it walks them from each profile's
roots, follows every call that receives a parser, and records ``add_argument`` calls; the vLLM and
SGLang loops that turn dataclass fields into flags are their own modules (``vllm_rules``,
``sglang_rules``)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence

from flag_catalog import architectures, sglang_rules, vllm_rules
from flag_catalog.args import NO_VALUE_ACTION_CLASSES, NO_VALUE_ACTIONS, ArgSpec, RecordField
from flag_catalog.consteval import Const, ConstEval, LocalLookup, Unresolved, as_sequence, choice_strings
from flag_catalog.hints import Hints
from flag_catalog.profiles import MAIN_BLOCK, Fallthrough, Profile, RegistrySource, Root
from flag_catalog.resolve import (
    ClassRef,
    ExternalRef,
    FuncRef,
    Ref,
    Resolver,
    ValueRef,
    class_body_member,
    where,
)
from flag_catalog.values import (
    _MISSING,
    BoundMethodVal,
    ConstVal,
    DictVal,
    FieldKwargsVal,
    FlagEntry,
    Frame,
    KwargsVal,
    Override,
    ParserVal,
    RefVal,
    SeqVal,
    StrVal,
    SuperVal,
    Val,
    const_str,
    const_to_val,
    init_nargs,
    is_classmethod,
    is_main_test,
    is_static,
    positional_params,
    target_names,
    val_to_const,
)
from flag_catalog.wheel import Binding, Wheel, collect_bindings


class Extractor:
    def __init__(self, wheel: Wheel, profile: Profile) -> None:
        self.wheel = wheel
        self.profile = profile
        self.resolver = Resolver(wheel, profile.pinned)
        self.consts = ConstEval(self.resolver)
        self.hints = Hints(self.resolver, self.consts)
        self.flags: dict[str, FlagEntry] = {}
        self.option_owner: dict[str, str] = {}
        self.warnings: list[str] = []
        self.positionals: list[str] = []
        self.followed: set[str] = set()
        self.add_argument_calls = 0
        self._active: list[tuple[int, int]] = []
        self.inverse_prefixes = self._inverse_prefixes()

    # -- reporting -----------------------------------------------------------
    def warn(self, message: str) -> None:
        if message not in self.warnings:
            self.warnings.append(message)

    def _inverse_prefixes(self) -> dict[str, str]:
        spec = self.profile.bool_action_override
        if spec is None:
            return {}
        ref = self.resolver.symbol(spec[0], spec[1])
        if not isinstance(ref, ClassRef):
            self.warn(f"bool action override {spec[0]}.{spec[1]} not found")
            return {}
        member = class_body_member(ref, "_inverse_prefixes")
        if not isinstance(member, ValueRef):
            self.warn(f"{spec[1]}._inverse_prefixes not found")
            return {}
        value = self.consts.eval(member.module, member.expr)
        if not isinstance(value, dict):
            return {}
        return {str(k): str(v) for k, v in value.items()}

    # -- entry -------------------------------------------------------------
    def run(self) -> None:
        for root in self.profile.roots:
            if root.qualname == MAIN_BLOCK:
                self.run_main_block(root)
                continue
            ref = self._root_ref(root)
            if ref is None:
                self.warn(f"root {root.module}:{root.qualname} not found")
                continue
            params = positional_params(ref.node)
            if ref.owner is not None and not is_static(ref.node):
                params = params[1:]
            # A root either receives the parser (first parameter) or builds its own.
            args: list[Val | None] = [ParserVal()] if params else []
            implicit: Val | None = RefVal(ref.owner) if ref.owner is not None else None
            kwargs: dict[str, Val | None] = {name: const_to_val(value) for name, value in root.kwargs}
            self.call_function(ref, args, kwargs, bound_cls=ref.owner, implicit=implicit, subcommand=root.subcommand)
        self.add_flag(["--help", "-h"], ArgSpec("none"), "argparse add_help default")
        for manual in self.profile.manual_flags:
            mod = self.wheel.module(manual.module)
            if mod is None or f'"{manual.flag}"' not in mod.source:
                self.warn(f"manual flag {manual.flag} not found in {manual.module}")
                continue
            spec = ArgSpec("required" if manual.takes_value else "none")
            self.add_flag([manual.flag], spec, f"{manual.module} (parsed by hand)")
        for flag_set in self.profile.flag_sets:
            try:
                value = self.consts.ref(self.resolver.symbol(flag_set.module, flag_set.name), None, 0)
            except Unresolved as exc:
                self.warn(f"flag set {flag_set.module}.{flag_set.name}: {exc}")
                continue
            names = as_sequence(value)
            for name in names:
                if isinstance(name, str) and name.startswith("-") and name not in self.option_owner:
                    spec = ArgSpec("required" if flag_set.takes_value else "none")
                    self.add_flag([name], spec, f"{flag_set.module}.{flag_set.name}")
        if self.profile.fallthrough is not None:
            self.run_fallthrough(self.profile.fallthrough)

    def run_fallthrough(self, fallthrough: Fallthrough) -> None:
        """Add the flags of the parser that takes what the serve parser leaves: an option string
        the serve parser (or the launcher) already claims stays the engine's."""
        other = Extractor(self.wheel, Profile(self.profile.engine, self.profile.launch, fallthrough.roots))
        other.run()
        self.add_argument_calls += other.add_argument_calls
        self.followed |= other.followed
        self.positionals += other.positionals
        for message in other.warnings:
            self.warn(f"{fallthrough.distribution}: {message}")
        for key, entry in sorted(other.flags.items()):
            free = [option for option in (key, *entry.aliases) if option not in self.option_owner]
            if not free:
                continue
            longs = [option for option in free if option.startswith("--")]
            first = longs[0] if longs else free[0]
            aliases = [option for option in free if option != first]
            origin = f"{fallthrough.distribution}: {entry.origin}"
            self._store(first, aliases, entry.takes_value, entry.choices, origin)

    def run_main_block(self, root: Root) -> None:
        mod = self.wheel.module(root.module)
        blocks = [st.body for st in mod.tree.body if isinstance(st, ast.If) and is_main_test(st.test)] if mod else []
        if not blocks:
            self.warn(f'root {root.module}: no `if __name__ == "__main__":` block')
            return
        self.followed.add(f"{root.module}:{MAIN_BLOCK}")
        frame = Frame(root.module, {}, None, None, root.subcommand, main_block=True)
        for body in blocks:
            self.exec_block(body, frame)

    def _root_ref(self, root: Root) -> FuncRef | None:
        parts = root.qualname.split(".")
        ref: Ref | None = self.resolver.symbol(root.module, parts[0])
        for part in parts[1:]:
            ref = self.resolver.attribute(ref, part)
        return ref if isinstance(ref, FuncRef) else None

    # -- flags ---------------------------------------------------------------
    def add_flag(self, options: list[str], spec: ArgSpec, origin: str) -> None:
        longs = [o for o in options if o.startswith("--")]
        key = longs[0] if longs else options[0]
        aliases = [o for o in options if o != key]
        self._store(key, aliases, spec.value != "none", spec.choices, origin)
        if spec.boolean_optional:
            for opt in longs:
                negatives = [f"--no-{opt[2:]}"]
                for prefix, inverse in self.inverse_prefixes.items():
                    if opt.startswith(prefix):
                        negatives.append(inverse + opt[len(prefix) :])
                for negative in negatives:
                    self._store(negative, [], False, None, f"{origin} (negation of {opt})")

    def _store(self, key: str, aliases: list[str], takes_value: bool, choices: list[str] | None, origin: str) -> None:
        for option in [key, *aliases]:
            owner = self.option_owner.get(option)
            if owner is not None and owner != key:
                self.warn(f"option {option} registered for both {owner} and {key} ({origin})")
            self.option_owner.setdefault(option, key)
        existing = self.flags.get(key)
        if existing is None:
            self.flags[key] = FlagEntry(list(aliases), takes_value, choices, origin)
            return
        same = (
            existing.takes_value == takes_value
            and existing.choices == choices
            and set(aliases) <= set(existing.aliases)
        )
        if not same:
            self.warn(f"flag {key} registered twice with different specs ({existing.origin}; {origin})")
        for alias in aliases:
            if alias not in existing.aliases:
                existing.aliases.append(alias)
        existing.takes_value = existing.takes_value or takes_value
        if existing.choices is None or choices is None:
            existing.choices = None
        else:
            existing.choices = sorted(set(existing.choices) | set(choices))

    # -- function calls -------------------------------------------------------
    def call_function(
        self,
        ref: FuncRef,
        args: list[Val | None],
        kwargs: dict[str, Val | None],
        *,
        bound_cls: ClassRef | None,
        implicit: Val | None,
        subcommand: str | None,
        builds_parser: bool = False,
    ) -> Val | None:
        key = (id(ref.node), id(bound_cls.node) if bound_cls else 0)
        if key in self._active or len(self._active) > 40:
            return None
        self.followed.add(f"{self.resolver.dotted_name(ref)}")
        params = positional_params(ref.node)
        local: dict[str, Val] = {}
        values: list[Val | None] = list(args)
        if ref.owner is not None and not is_static(ref.node):
            if is_classmethod(ref.node):
                values.insert(0, RefVal(bound_cls or ref.owner))
            else:
                values.insert(0, implicit)
        for name, value in zip(params, values, strict=False):
            if value is not None:
                local[name] = value
        for name, kwvalue in kwargs.items():
            if kwvalue is not None:
                local[name] = kwvalue
        frame = Frame(ref.module, local, ref.owner, bound_cls, subcommand, builds_parser=builds_parser)
        self._active.append(key)
        try:
            self.exec_block(ref.node.body, frame)
        finally:
            self._active.pop()
        for ret in frame.returns:
            if ret is not None:
                return ret
        return None

    # -- statements -------------------------------------------------------------
    def exec_block(self, stmts: Sequence[ast.stmt], frame: Frame) -> None:
        for st in stmts:
            self.exec_stmt(st, frame)

    def exec_stmt(self, st: ast.stmt, frame: Frame) -> None:
        if isinstance(st, ast.Assign):
            value = self.eval(st.value, frame)
            for target in st.targets:
                self.assign(target, value, st.value, frame)
        elif isinstance(st, ast.AnnAssign) and st.value is not None:
            self.assign(st.target, self.eval(st.value, frame), st.value, frame)
        elif isinstance(st, ast.Expr):
            self.eval(st.value, frame)
        elif isinstance(st, ast.Return):
            if st.value is not None:
                ret = self.eval(st.value, frame)
                if ret is not None:
                    frame.returns.append(ret)
        elif isinstance(st, ast.If):
            self.eval(st.test, frame)
            # A test on an argument the caller passed as a constant takes one branch (smg's
            # ``if use_router_prefix:``); any other test, both.
            known = frame.locals.get(st.test.id) if isinstance(st.test, ast.Name) else None
            if isinstance(known, (ConstVal, StrVal)):
                self.exec_block(st.body if known.value else st.orelse, frame)
                return
            self.exec_block(st.body, frame)
            self.exec_block(st.orelse, frame)
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            self.exec_for(st, frame)
        elif isinstance(st, ast.While):
            self.exec_block(st.body, frame)
            self.exec_block(st.orelse, frame)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                value = self.eval(item.context_expr, frame)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value, item.context_expr, frame)
            self.exec_block(st.body, frame)
        elif isinstance(st, ast.Try):
            self.exec_block(st.body, frame)
            for handler in st.handlers:
                self.exec_block(handler.body, frame)
            self.exec_block(st.orelse, frame)
            self.exec_block(st.finalbody, frame)
        elif isinstance(st, (ast.Import, ast.ImportFrom)):
            bindings: dict[str, Binding] = {}
            collect_bindings([st], frame.module, self._is_package(frame.module), bindings)
            mod = self.wheel.module(frame.module)
            for name, binding in bindings.items():
                ref = self.resolver.binding(mod, name, binding, 0) if mod else None
                if ref is not None:
                    frame.locals[name] = RefVal(ref)
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
            frame.locals[st.name] = RefVal(FuncRef(frame.module, st, None))
        elif isinstance(st, ast.Delete):
            return

    def _is_package(self, module: str) -> bool:
        return module in self.wheel.packages

    def assign(self, target: ast.expr, value: Val | None, value_expr: ast.expr, frame: Frame) -> None:
        if isinstance(target, ast.Name):
            if value is None:
                frame.locals.pop(target.id, None)
            else:
                frame.locals[target.id] = value
            return
        if isinstance(target, ast.Subscript):
            key = const_str(target.slice)
            base = self.eval(target.value, frame)
            if isinstance(base, FieldKwargsVal) and key is not None:
                over = base.kwargs.overrides.setdefault(base.name, {})
                over[key] = Override(value_expr, frame)
            elif isinstance(base, KwargsVal) and key is not None:
                self.warn(
                    f"whole-field kwargs replacement {ast.unparse(target)} at "
                    f"{where(frame.module, target)} not modelled"
                )

    def exec_for(self, st: ast.For | ast.AsyncFor, frame: Frame) -> None:
        it = st.iter
        # for key, value in get_kwargs(Cls).items(): add_argument(f"--{key...}", **value)
        if (
            isinstance(it, ast.Call)
            and isinstance(it.func, ast.Attribute)
            and it.func.attr == "items"
            and isinstance(st.target, ast.Tuple)
            and len(st.target.elts) == 2
            and all(isinstance(e, ast.Name) for e in st.target.elts)
        ):
            base = self.eval(it.func.value, frame)
            if isinstance(base, KwargsVal):
                key_name = st.target.elts[0]
                val_name = st.target.elts[1]
                assert isinstance(key_name, ast.Name)
                assert isinstance(val_name, ast.Name)
                for rec in self.dataclass_fields(base.cls):
                    frame.locals[key_name.id] = StrVal(rec.name)
                    frame.locals[val_name.id] = FieldKwargsVal(base, rec.name)
                    self.exec_block(st.body, frame)
                return
        seq = self.eval(it, frame)
        if isinstance(seq, ConstVal):
            try:
                items: list[Val] = [const_to_val(v) for v in as_sequence(seq.value)]
            except Unresolved:
                items = []
            seq = SeqVal(items)
        if isinstance(seq, SeqVal) and isinstance(st.target, ast.Name):
            for item in seq.items:
                frame.locals[st.target.id] = item
                self.exec_block(st.body, frame)
            return
        for name in target_names(st.target):
            frame.locals.pop(name, None)
        self.exec_block(st.body, frame)
        self.exec_block(st.orelse, frame)

    # -- expressions ------------------------------------------------------------
    def eval(self, expr: ast.expr, frame: Frame) -> Val | None:  # noqa: PLR0911 (one case per syntax form)
        if isinstance(expr, ast.Name):
            if expr.id in frame.locals:
                return frame.locals[expr.id]
            ref = self.resolver.symbol(frame.module, expr.id)
            return RefVal(ref) if ref is not None else None
        if isinstance(expr, ast.Constant):
            if isinstance(expr.value, str):
                return StrVal(expr.value)
            return ConstVal(expr.value)
        if isinstance(expr, ast.JoinedStr):
            return self.eval_fstring(expr, frame)
        if isinstance(expr, ast.Attribute):
            base = self.eval(expr.value, frame)
            if isinstance(base, RefVal):
                member = self.resolver.attribute(base.ref, expr.attr)
                if isinstance(member, FuncRef) and member.owner is not None:
                    bound = base.ref if isinstance(base.ref, ClassRef) else None
                    return BoundMethodVal(member, bound, None)
                return RefVal(member) if member is not None else None
            if isinstance(base, SuperVal):
                if base.bound_cls is None:
                    return None
                member = self.resolver.class_member(base.bound_cls, expr.attr, after=base.owner)
                if isinstance(member, FuncRef):
                    return BoundMethodVal(member, base.bound_cls, None)
                return None
            return None
        if isinstance(expr, ast.Subscript):
            base = self.eval(expr.value, frame)
            key = const_str(expr.slice)
            if isinstance(base, KwargsVal) and key is not None:
                return FieldKwargsVal(base, key)
            return None
        if isinstance(expr, (ast.List, ast.Tuple)):
            items: list[Val] = []
            for elt in expr.elts:
                if isinstance(elt, ast.Starred):
                    inner = self.eval(elt.value, frame)
                    if isinstance(inner, SeqVal):
                        items.extend(inner.items)
                    else:
                        return self.const(expr, frame)
                    continue
                val = self.eval(elt, frame)
                if val is None:
                    return self.const(expr, frame)
                items.append(val)
            return SeqVal(items)
        if isinstance(expr, ast.Dict):
            return DictVal(expr, frame)
        if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add):
            left = self.eval(expr.left, frame)
            right = self.eval(expr.right, frame)
            if isinstance(left, StrVal) and isinstance(right, StrVal):
                return StrVal(left.value + right.value)
            if isinstance(left, SeqVal) and isinstance(right, SeqVal):
                return SeqVal(left.items + right.items)
            return self.const(expr, frame)
        if isinstance(expr, ast.Call):
            return self.eval_call(expr, frame)
        if isinstance(expr, ast.IfExp):
            # ``prefix = "router-" if use_router_prefix else ""``: a constant where the test is one
            return self.const(expr, frame)
        return None

    def const(self, expr: ast.expr, frame: Frame) -> Val | None:
        try:
            return ConstVal(self.consts.eval(frame.module, expr, self._lookup(frame)))
        except Unresolved:
            return None

    def _lookup(self, frame: Frame) -> LocalLookup:
        def lookup(name: str) -> Const | None:
            val = frame.locals.get(name)
            if val is None:
                return None
            try:
                return val_to_const(val, self.consts)
            except Unresolved:
                return None

        return lookup

    def eval_fstring(self, expr: ast.JoinedStr, frame: Frame) -> Val | None:
        parts: list[str] = []
        for value in expr.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue) and value.format_spec is None:
                inner = self.eval(value.value, frame)
                if isinstance(inner, ConstVal) and isinstance(inner.value, (str, int)):
                    inner = StrVal(str(inner.value))
                if not isinstance(inner, StrVal):
                    return None
                parts.append(inner.value)
            else:
                return None
        return StrVal("".join(parts))

    def eval_call(self, call: ast.Call, frame: Frame) -> Val | None:  # noqa: PLR0911 (one case per syntax form)
        func = call.func
        if isinstance(func, ast.Attribute):
            attr = func.attr
            if attr == "add_argument":
                self.record_add_argument(call, frame)
                return None
            if attr in {"add_argument_group", "add_mutually_exclusive_group", "add_subparsers"}:
                receiver = self.eval(func.value, frame)
                sub = receiver.sub if isinstance(receiver, ParserVal) else None
                return ParserVal(sub)
            if attr == "add_parser":
                return ParserVal(self.str_of(call.args[0], frame) if call.args else None)
            base = self.eval(func.value, frame)
            if isinstance(base, StrVal):
                return self.str_method(base, attr, call, frame)
            if isinstance(base, FieldKwargsVal) and attr == "pop":
                key = const_str(call.args[0]) if call.args else None
                over = base.kwargs.overrides.get(base.name, {})
                if key is not None and key in over:
                    return self.eval(over[key].expr, over[key].frame)
                if len(call.args) > 1:
                    return self.eval(call.args[1], frame)
                return None
            if attr == "remove" and isinstance(func.value, ast.Subscript):
                self.record_choice_removal(func.value, call, frame)
                return None
        if isinstance(func, ast.Name) and func.id == "super" and not call.args:
            if frame.owner is not None:
                return SuperVal(frame.owner, frame.bound_cls or frame.owner)
            return None
        callee = self.eval(func, frame)
        args: list[Val | None] = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                inner = self.eval(arg.value, frame)
                if isinstance(inner, SeqVal):
                    args.extend(inner.items)
                else:
                    args.append(None)
            else:
                args.append(self.eval(arg, frame))
        kwargs: dict[str, Val | None] = {
            kw.arg: self.eval(kw.value, frame) for kw in call.keywords if kw.arg is not None
        }
        carried = [a for a in [*args, *kwargs.values()] if isinstance(a, (ParserVal, KwargsVal))]
        func_ref: FuncRef | None = None
        bound: ClassRef | None = None
        implicit: Val | None = None
        if isinstance(callee, BoundMethodVal):
            func_ref, bound, implicit = callee.func, callee.bound_cls, callee.implicit
        elif isinstance(callee, RefVal) and isinstance(callee.ref, FuncRef):
            func_ref = callee.ref
        name = func_ref.node.name if func_ref is not None else ""
        if name == "get_kwargs" and args and isinstance(args[0], RefVal):
            target = args[0].ref
            if isinstance(target, ClassRef):
                return KwargsVal(target)
            self.warn(f"get_kwargs on non-class at {where(frame.module, call)}")
            return None
        if name == "add_cli_args_from_dataclass":
            sglang_rules.record_dataclass_loop(self, call, args, kwargs, frame)
            return None
        if (
            frame.builds_parser
            and isinstance(callee, RefVal)
            and isinstance(callee.ref, ClassRef)
            and self.is_parser_class(callee.ref)
        ):
            return ParserVal()
        if not carried and frame.main_block and func_ref is not None:
            # Only one level: what the main block calls builds the parser; what
            # those functions call without the parser (serving, logging) is not.
            self.call_function(
                func_ref,
                args,
                kwargs,
                bound_cls=bound,
                implicit=implicit,
                subcommand=frame.subcommand,
                builds_parser=True,
            )
            return None
        if not carried:
            return self.const(call, frame)
        if func_ref is None:
            if (isinstance(callee, RefVal) and isinstance(callee.ref, ExternalRef)) or callee is None:
                self.warn(
                    f"unresolved call receiving the parser: {ast.unparse(call)[:120]} at {where(frame.module, call)}"
                )
            elif isinstance(callee, RefVal) and isinstance(callee.ref, ClassRef):
                self.warn(
                    f"class constructed with the parser (not followed): "
                    f"{ast.unparse(call)[:120]} at {where(frame.module, call)}"
                )
            return carried[0]
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            receiver_name = func.value.id
            if receiver_name == "self" and implicit is None:
                implicit = frame.locals.get("self")
            if receiver_name == "cls" and bound is None and isinstance(frame.locals.get("cls"), RefVal):
                cls_val = frame.locals["cls"]
                assert isinstance(cls_val, RefVal)
                if isinstance(cls_val.ref, ClassRef):
                    bound = cls_val.ref
        result = self.call_function(
            func_ref, args, kwargs, bound_cls=bound, implicit=implicit, subcommand=frame.subcommand
        )
        return result if result is not None else carried[0]

    def is_parser_class(self, cls: ClassRef) -> bool:
        return any(
            isinstance(item, ExternalRef) and item.dotted == "argparse.ArgumentParser"
            for item in self.resolver.mro(cls)
        )

    def str_of(self, expr: ast.expr, frame: Frame) -> str | None:
        value = self.eval(expr, frame)
        if isinstance(value, StrVal):
            return value.value
        if value is not None:
            try:
                const = val_to_const(value, self.consts)
            except Unresolved:
                return None
            if isinstance(const, str):
                return const
        return None

    def str_method(self, base: StrVal, attr: str, call: ast.Call, frame: Frame) -> Val | None:
        args = [self.eval(a, frame) for a in call.args]
        strs = [a.value for a in args if isinstance(a, StrVal)]
        if len(strs) != len(args):
            return None
        if attr == "replace" and len(strs) == 2:
            return StrVal(base.value.replace(strs[0], strs[1]))
        if attr in {"lower", "upper", "strip", "lstrip", "rstrip"}:
            method: Callable[..., str] = getattr(base.value, attr)
            return StrVal(method(*strs))
        if attr == "removeprefix" and len(strs) == 1:
            return StrVal(base.value.removeprefix(strs[0]))
        if attr == "removesuffix" and len(strs) == 1:
            return StrVal(base.value.removesuffix(strs[0]))
        return None

    def record_choice_removal(self, target: ast.Subscript, call: ast.Call, frame: Frame) -> None:
        # kw["field"]["choices"].remove(X)
        if const_str(target.slice) != "choices":
            return
        base = self.eval(target.value, frame)
        if not isinstance(base, FieldKwargsVal) or not call.args:
            return
        value = self.eval(call.args[0], frame)
        if isinstance(value, RefVal):
            try:
                const = self.consts.ref(value.ref, None, 0)
            except Unresolved:
                self.warn(f"choice removal {ast.unparse(call)} unresolved")
                return
            value = const_to_val(const)
        if isinstance(value, StrVal):
            base.kwargs.removed_choices.setdefault(base.name, set()).add(value.value)

    # -- add_argument ---------------------------------------------------------------
    def record_add_argument(self, call: ast.Call, frame: Frame) -> None:
        self.add_argument_calls += 1
        assert isinstance(call.func, ast.Attribute)
        receiver = self.eval(call.func.value, frame)
        if frame.subcommand is not None and isinstance(receiver, ParserVal) and receiver.sub != frame.subcommand:
            return
        origin = where(frame.module, call)
        options: list[str] = []
        for arg in call.args:
            if isinstance(arg, ast.Starred):
                inner = self.eval(arg.value, frame)
                if isinstance(inner, SeqVal):
                    for item in inner.items:
                        if isinstance(item, StrVal):
                            options.append(item.value)
                        else:
                            self.warn(f"unresolved option string in {ast.unparse(arg)} at {origin}")
                elif isinstance(inner, ConstVal) and isinstance(inner.value, list):
                    options.extend(str(v) for v in inner.value)
                elif inner is not None:
                    self.warn(f"unresolved *{ast.unparse(arg.value)} at {origin}")
                continue
            value = self.eval(arg, frame)
            if isinstance(value, StrVal):
                options.append(value.value)
            else:
                self.warn(f"unresolved option string {ast.unparse(arg)[:80]} at {origin}")
        if not options:
            self.warn(f"add_argument without resolvable names at {origin}")
            return
        flags = [o for o in options if o.startswith("-")]
        if not flags:
            self.positionals.extend(options)
            return
        spec = ArgSpec()
        self.apply_kwargs(call.keywords, frame, spec)
        self.add_flag(flags, spec, origin)

    def apply_kwargs(self, keywords: Sequence[ast.keyword], frame: Frame, spec: ArgSpec) -> None:
        for kw in keywords:
            if kw.arg is None:
                self.apply_splat(kw.value, frame, spec)
            else:
                self.apply_key(kw.arg, kw.value, frame, spec)

    def apply_splat(self, expr: ast.expr, frame: Frame, spec: ArgSpec) -> None:
        value = self.eval(expr, frame)
        if isinstance(value, FieldKwargsVal):
            vllm_rules.apply_field(self, value, spec)
            return
        if isinstance(value, DictVal):
            for key, item in zip(value.expr.keys, value.expr.values, strict=True):
                if key is None:
                    self.apply_splat(item, value.frame, spec)
                else:
                    name = const_str(key)
                    if name is not None:
                        self.apply_key(name, item, value.frame, spec)
            return
        self.warn(f"unresolved **{ast.unparse(expr)[:80]} at {where(frame.module, expr)}")

    def apply_key(self, key: str, expr: ast.expr, frame: Frame, spec: ArgSpec) -> None:
        if key == "action":
            action = self.action_spec(expr, frame)
            if action is not None:
                spec.value, spec.boolean_optional = action.value, action.boolean_optional
        elif key == "nargs":
            value = self.eval(expr, frame)
            if isinstance(value, (StrVal, ConstVal)):
                spec.nargs(value.value)
        elif key == "choices":
            spec.choices = self.choices(expr, frame)

    def choices(self, expr: ast.expr, frame: Frame) -> list[str] | None:
        try:
            value = self.consts.eval(frame.module, expr, self._lookup(frame))
            return choice_strings(as_sequence(value))
        except Unresolved as exc:
            self.warn(f"non-literal choices {ast.unparse(expr)[:80]} at {where(frame.module, expr)}: {exc}")
            return None

    def action_spec(self, expr: ast.expr, frame: Frame) -> ArgSpec | None:
        value = self.eval(expr, frame)
        if isinstance(value, StrVal):
            return ArgSpec("none" if value.value in NO_VALUE_ACTIONS else "required")
        if isinstance(value, RefVal):
            return self.action_class(value.ref)
        if isinstance(value, BoundMethodVal):
            return None
        self.warn(f"unresolved action {ast.unparse(expr)[:80]} at {where(frame.module, expr)}")
        return None

    def action_class(self, ref: Ref) -> ArgSpec | None:  # noqa: PLR0911 (one case per syntax form)
        if isinstance(ref, ExternalRef):
            name = ref.dotted.rsplit(".", 1)[-1]
            if name == "BooleanOptionalAction":
                return ArgSpec("none", boolean_optional=True)
            if name in NO_VALUE_ACTION_CLASSES:
                return ArgSpec("none")
            return ArgSpec("required")
        if not isinstance(ref, ClassRef):
            return None
        for item in self.resolver.mro(ref):
            if isinstance(item, ExternalRef):
                ext = self.action_class(item)
                if ext is not None and (ext.value == "none" or ext.boolean_optional):
                    return ext
                continue
            if not isinstance(item, ClassRef):
                continue
            init = class_body_member(item, "__init__")
            if isinstance(init, FuncRef):
                nargs = init_nargs(init.node)
                if nargs is not _MISSING:
                    spec = ArgSpec()
                    spec.nargs(nargs)
                    return spec
        return ArgSpec("required")

    # -- dataclass loops ------------------------------------------------------------
    def dataclass_fields(self, cls: ClassRef) -> list[RecordField]:
        """Fields in definition order, bases first (dataclasses / msgspec / assembled)."""
        out: dict[str, RecordField] = {}
        for assembly in self.profile.assemblies:
            if assembly.module == cls.module and assembly.cls == cls.node.name:
                ref = self.resolver.symbol(assembly.parts_module, assembly.parts_list)
                if not isinstance(ref, ValueRef) or not isinstance(ref.expr, (ast.List, ast.Tuple)):
                    self.warn(f"assembly list {assembly.parts_list} not found")
                    continue
                for elt in ref.expr.elts:
                    part = self.resolver.expr(ref.module, elt)
                    if isinstance(part, ClassRef):
                        for rec in self.dataclass_fields(part):
                            out.setdefault(rec.name, rec)
                    else:
                        self.warn(f"assembly part {ast.unparse(elt)} unresolved")
        chain = [c for c in reversed(self.resolver.mro(cls)) if isinstance(c, ClassRef)]
        for klass in chain:
            for st in klass.node.body:
                if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                    hints = self.hints.flatten(klass.module, st.annotation)
                    if any(h.kind == "classvar" for h in hints):
                        continue
                    name = st.target.id
                    rec = RecordField(name, klass.module, st.annotation)
                    if name in out:
                        out[name] = rec
                    else:
                        out[name] = rec
        return list(out.values())

    # -- registries -----------------------------------------------------------------
    def registries(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, sources in self.profile.registries:
            names: set[str] = set()
            found = False
            for source in sources:
                try:
                    values = self.registry_source(source)
                except Unresolved as exc:
                    self.warn(f"registry {name} from {source.module}.{source.name}: {exc}")
                    continue
                found = True
                names.update(values)
            if found:
                out[name] = sorted(names)
        return out

    def registry_source(self, source: RegistrySource) -> list[str]:  # noqa: PLR0911 (one case per kind)
        if source.kind == "model_table":
            return architectures.model_table(self.wheel, self.consts, source, self.warn)
        if source.kind == "entry_classes":
            return architectures.entry_classes(self.wheel, self.resolver, source, self.warn)
        if source.kind == "subscript_keys":
            return architectures.subscript_keys(self.wheel, source)
        if source.kind == "flag_choices":
            entry = self.flags.get(source.name)
            if entry is None:
                raise Unresolved(f"flag {source.name} not in catalog")
            if entry.choices is None:
                raise Unresolved(f"flag {source.name} has no literal choices")
            return list(entry.choices)
        ref = self.resolver.symbol(source.module, source.name)
        if source.kind == "dict_keys":
            value = self.consts.ref(ref, None, 0)
            if not isinstance(value, dict):
                raise Unresolved("not a dict")
            return choice_strings(value.keys())
        if source.kind == "sequence":
            return choice_strings(as_sequence(self.consts.ref(ref, None, 0)))
        if source.kind == "literal":
            if not isinstance(ref, ValueRef):
                raise Unresolved("literal alias not found")
            values = self.consts.literal_values(ref.module, ref.expr)
            if values is None:
                raise Unresolved("not a Literal")
            return choice_strings(values)
        if source.kind == "enum_members":
            if not isinstance(ref, ClassRef):
                raise Unresolved("enum class not found")
            return sorted(self.consts.enum_members(ref))
        if source.kind == "call_arg":
            mod = self.wheel.module(source.module)
            if mod is None:
                raise Unresolved("module not found")
            found: list[str] = []
            for node in ast.walk(mod.tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, (ast.Attribute, ast.Name))
                    and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == source.name
                ):
                    arg = node.args[0] if node.args else None
                    if arg is None:
                        for kw in node.keywords:
                            if kw.arg == "name":
                                arg = kw.value
                    if arg is not None:
                        value = self.consts.eval(mod.name, arg)
                        if isinstance(value, str):
                            found.append(value)
            if not found:
                raise Unresolved("no calls found")
            return sorted(set(found))
        raise Unresolved(f"unknown registry kind {source.kind}")
