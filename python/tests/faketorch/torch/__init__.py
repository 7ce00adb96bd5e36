"""A stand-in for the parts of torch that `coorfs run`'s hook meets, with the standard library
only, for python/tests/test_run.py and tests/it/run.rs (CI has no torch; with torch installed,
test_run.py runs the same jobs on the real one too).

It keeps what the hook depends on where torch 2.x has it: `import torch` imports
torch.utils.data; DataLoader._index_sampler is a property; a DataLoader iterator calls iter() on
it and then draws its workers' base seed from the generator; RandomSampler draws its own seed
from the global generator at its first next(); forked workers seed themselves with the base
seed plus their id. Random numbers come from Python's `random`, not torch's generator, so the
values differ from torch's, but not where they are drawn.
"""
import random

__version__ = "0.0+fake"


class Tensor:
    """Just enough of a tensor: a list of numbers."""

    def __init__(self, values):
        self.values = list(values)

    def tolist(self):
        return list(self.values)

    def item(self):
        (value,) = self.values
        return value


class Generator:
    def __init__(self):
        self.rng = random.Random(0)

    def manual_seed(self, seed):
        self.rng.seed(seed)
        return self


default_generator = Generator()


def manual_seed(seed):
    return default_generator.manual_seed(seed)


def _rng(generator):
    return (generator or default_generator).rng


def seed_from(generator=None):
    """torch.empty((), dtype=torch.int64).random_(generator=...).item(): a fresh 63-bit seed."""
    return _rng(generator).getrandbits(63)


def randperm(n, generator=None):
    order = list(range(n))
    _rng(generator).shuffle(order)
    return Tensor(order)


def randint(high, size, generator=None):
    rng = _rng(generator)
    return Tensor(rng.randrange(high) for _ in range(size[0]))


def rand(n, generator=None):
    rng = _rng(generator)
    return Tensor(rng.random() for _ in range(n))


def multinomial(weights, n, replacement=True, generator=None):
    rng = _rng(generator)
    return Tensor(rng.choices(range(len(weights)), weights=weights, k=n))


import torch.utils.data  # noqa: E402,F401  (torch imports it too)
