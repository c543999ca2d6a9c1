"""How transformers calls each kind of rotation function `hf.install` patches: shapes and arguments.

Used by ``test_hf_install.py``, ``test_hf_gradcheck.py`` and ``test_hf_compile.py``; needs torch.
`cases` gives the shapes of the data and of the cos/sin cache a function of the
kind a ``RotaryFunction`` describes is called with, `cache` a cache in the form
it reads, and `call` the call itself (one tensor a call or all of them, its
parameters in its order, ``unsqueeze_dim`` where it has one).
"""

import torch

from posenc_fast import hf


class Case:
    """One call's shapes: `unsqueeze_dim` (None where the function has none), the data's shapes, the
    cos/sin cache's leading shape, and the `positions` it indexes the cache by (CLVP's)."""

    def __init__(self, unsqueeze_dim, shapes, lead, positions=None):
        self.unsqueeze_dim, self.shapes, self.lead, self.positions = unsqueeze_dim, shapes, lead, positions


def cases(function, dim=16):
    """The calls of `function` to compare in: q and k (one key head) as its attention passes them."""
    if function.unsqueeze is not None and function.dims is not None:
        # GPT-J's: (batch, seq, heads, rotary_dim) tensors, (batch, seq, rotary_dim / 2) sin and cos
        return [Case(function.unsqueeze, [(2, 5, 3, dim), (2, 5, 1, dim)], (2, 5))]
    if function.prefix_tokens:  # (batch, heads, tokens, dim), cos/sin (patches, dim): 2 prefix tokens, or none
        return [Case(None, [(2, 3, 7, dim), (2, 1, 7, dim)], (5,)), Case(None, [(2, 3, 5, dim)] * 2, (5,))]
    if "position_ids" in hf._parameters(function):  # CLVP's q, k and v, a (positions, dim) cache
        return [Case(1, [(2, 3, 5, dim)] * 3, (7,), torch.tensor([[0, 1, 2, 3, 4]])),
                Case(1, [(2, 3, 5, dim)] * 3, (7,), torch.tensor([[6, 2, 0, 5, 5], [1, 2, 3, 4, 5]]))]
    if function.query_rows:  # k with 2 tokens of context before q's 3
        return [Case(1, [(2, 3, 3, dim), (2, 1, 5, dim)], (2, 5))]
    if function.unsqueeze is not None:  # a vision tower's (patches, heads, dim), cos/sin (patches, dim)
        return [Case(None, [(10, 3, dim), (10, 1, dim)], (10,))]
    # (batch, heads, seq, dim) or (batch, seq, heads, dim)
    return [Case(1, [(2, 3, 5, dim), (2, 1, 5, dim)], (2, 5)), Case(2, [(2, 5, 3, dim), (2, 5, 1, dim)], (2, 5))]


def cache(function, lead, rotated, dtype=torch.float64, seed=0, repeat=True):
    """A cos/sin `rotated` features wide of leading shape `lead` in the form `function` reads
    (`repeat`=False: entries that do not repeat as it expects)."""
    generator = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 4096, (*lead, 1), generator=generator).double()
    angles = positions * 10000.0 ** (-torch.arange(0, rotated, 2, dtype=torch.float64) / rotated)
    if function.cache == "pairs":
        angles = angles.repeat_interleave(2, dim=-1)
    elif function.cache == "halves":
        angles = torch.cat((angles, angles), dim=-1)
    if not repeat:
        angles = angles + torch.rand(angles.shape, generator=generator, dtype=torch.float64)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def data(case, dtype=torch.float64, seed=7, requires_grad=False):
    """Random data of the case's shapes."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype).requires_grad_(requires_grad)
            for shape in case.shapes]


def call(function, apply, xs, cos, sin, case):
    """The results of `apply`, a function of the kind `function` says, for the data `xs`, as a tuple:
    called as transformers calls it (one tensor a call, or all; its parameters in its order; the
    `case`'s unsqueeze_dim where it has one and position_ids where it takes them)."""
    parameters = hf._parameters(function)
    kwargs = {} if function.unsqueeze is not None else {"unsqueeze_dim": case.unsqueeze_dim}
    given = {"cos": cos, "sin": sin, "position_ids": case.positions}

    def one(data):
        data = iter(data)
        return apply(*[given[p] if p in given else next(data) for p in parameters], **kwargs)

    if function.one_tensor:
        return tuple(one((x,)) for x in xs)
    return tuple(one(xs))


def indexed(function, cos, sin, case):
    """cos and sin as the function rotates by them: ``cos[position_ids]`` where it takes position_ids."""
    if "position_ids" in hf._parameters(function):
        return cos[case.positions], sin[case.positions]
    return cos, sin
