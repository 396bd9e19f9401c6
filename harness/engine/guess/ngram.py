"""Guess-ahead by prompt lookup (`--ngram`): pure logic, no llama.cpp.

A guess is the continuation of the latest earlier occurrence of the last `n` tokens of the history (the prompt
and the reply so far). The continuation is copied from the history as extended by the guess itself, so a loop
shorter than the guess (the reply repeating a few tokens) is guessed around more than once. The session decodes
the sampled token and its guess in one batch with logits at every position, keeps the longest prefix of the
guess that equals the greedy token at each position, and takes the greedy token after it as the next one:
exactly the tokens plain greedy decoding would produce, fewer decodes when guesses are right.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def ngram_guess(history: Sequence[int], n: int, max_len: int,
                stop: Callable[[int], bool] = lambda t: False) -> list[int]:
    """Up to `max_len` tokens continuing the latest earlier occurrence of `history`'s last `n` tokens; [] when
    there is none. The guess ends before the first token `stop` says ends a generation (an end-of-generation
    token is never guessed: the loop stops on it before decoding it)."""
    if max_len <= 0 or n <= 0 or len(history) <= n:
        return []
    h = list(history)
    key = h[-n:]
    first = key[0]
    for i in range(len(h) - n - 1, -1, -1):
        if h[i] == first and h[i:i + n] == key:
            src = i + n
            out: list[int] = []
            for _ in range(max_len):
                t = h[src] if src < len(h) else out[src - len(h)]
                if stop(t):
                    break
                out.append(t)
                src += 1
            return out
    return []


def split_int(total: int, n: int) -> list[int]:
    """`total` over `n` rows, summing exactly (the remainder on the first)."""
    base, rem = divmod(total, n)
    return [base + rem] + [base] * (n - 1)
