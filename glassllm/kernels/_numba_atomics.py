"""What numba lacks for threads that hand work to each other without the GIL or the OS: atomic
loads, stores and compare-exchange on an int64 array element, a spin-wait hint, and a raw address
as a typed pointer (for `numba.carray`). Each is an LLVM instruction emitted by an intrinsic;
`glassllm.kernels._numba_row_pool` is their one user.

Orderings: a load *acquires* (whatever the thread that stored the value wrote before it is seen
after it), a store *releases*, a compare-exchange does both. On x86 these are plain moves (and a
``lock cmpxchg``); what they add there is that LLVM may neither drop a load from a spin loop nor
move the job's fields past the store that publishes them.
"""

from __future__ import annotations

import os
import platform

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
_POSIX = os.name == "posix"


def _element(context, builder, array_type, array, index):
    """The address of ``array[index]`` (1-D) in LLVM IR."""
    values = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, values, [index])


@intrinsic
def load_acquire(typingctx, array, index):
    """``array[index]`` (int64, 1-D) read with acquire ordering."""

    def codegen(context, builder, signature, args):
        pointer = _element(context, builder, signature.args[0], args[0], args[1])
        return builder.load_atomic(pointer, "acquire", 8)

    return types.int64(array, index), codegen


@intrinsic
def store_release(typingctx, array, index, value):
    """``array[index] = value`` (int64, 1-D) with release ordering."""

    def codegen(context, builder, signature, args):
        pointer = _element(context, builder, signature.args[0], args[0], args[1])
        builder.store_atomic(args[2], pointer, "release", 8)
        return context.get_dummy_value()

    return types.none(array, index, types.int64), codegen


@intrinsic
def compare_exchange(typingctx, array, index, expected, new):
    """Atomically: ``old = array[index]``; if ``old == expected``, ``array[index] = new``. Returns
    ``old`` (so the exchange happened exactly when it equals ``expected``)."""

    def codegen(context, builder, signature, args):
        pointer = _element(context, builder, signature.args[0], args[0], args[1])
        result = builder.cmpxchg(pointer, args[2], args[3], "acq_rel", "acquire")
        return builder.extract_value(result, 0)

    return types.int64(array, index, types.int64, types.int64), codegen


def _call(builder, name, returns):
    """A call of the argument-less function ``name`` (an LLVM intrinsic or a libc symbol)."""
    function = ir.FunctionType(returns, [])
    builder.call(cgutils.get_or_insert_function(builder.module, function, name), [])


@intrinsic
def spin_pause(typingctx):
    """x86's ``pause`` (a spinning core yields its pipeline and saves power); nothing elsewhere."""

    def codegen(context, builder, signature, args):
        if _X86:
            _call(builder, "llvm.x86.sse2.pause", ir.VoidType())
        return context.get_dummy_value()

    return types.none(), codegen


@intrinsic
def yield_thread(typingctx):
    """POSIX ``sched_yield()``: the core goes to another runnable thread, if there is one (a
    spinning helper must not take a busy machine's time from the thread it helps); x86's
    ``pause`` where there is no ``sched_yield`` (Windows)."""

    def codegen(context, builder, signature, args):
        if _POSIX:
            _call(builder, "sched_yield", ir.IntType(32))
        elif _X86:
            _call(builder, "llvm.x86.sse2.pause", ir.VoidType())
        return context.get_dummy_value()

    return types.none(), codegen


def _pointer_to(element: types.Type):
    @intrinsic
    def pointer(typingctx, address):
        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(signature.return_type))

        return types.CPointer(element)(types.int64), codegen

    return pointer


# ``numba.carray(float32_at(address), shape)``: the array another thread published by address
float32_at = _pointer_to(types.float32)
uint8_at = _pointer_to(types.uint8)
int8_at = _pointer_to(types.int8)
