"""The guess-ahead columns of results and findings: guesses kept per verify batch counts only the rows that carried
guesses (a batch's first row), and the kept share is over the guesses made."""

import math

import numpy as np

from harness.report.results import _per_batch, _share


def test_kept_per_batch_counts_only_the_rows_that_carried_guesses():
    proposed = [np.array([4, 0, 0, 4, 0, 0, 0, 4]), np.array([2, 0, np.nan])]
    kept = [np.array([2, 0, 0, 3, 0, 0, 0, 0]), np.array([1, 0, np.nan])]
    assert _per_batch(kept, proposed) == (2 + 3 + 0 + 1) / 4
    assert _share(kept, proposed) == 100 * 6 / 14


def test_no_guess_made_is_unmeasured_not_zero():
    assert math.isnan(_per_batch([np.array([0, 0])], [np.array([0, 0])]))
    assert math.isnan(_per_batch([], []))
