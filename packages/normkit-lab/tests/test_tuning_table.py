"""The tuning table's edge warnings: numeric grids have edges; a program's own text values have none."""

from normkit_lab.analysis.tuning import edge_warnings, tuned_norms


def _row(norm, values, score, chosen):
    return {"cell": {}, "norm": norm, "values": values, "val_acc": score, "chosen": chosen}


def test_a_chosen_value_at_the_end_of_a_numeric_grid_is_an_edge():
    table = [_row("bn", {"lr": 0.01}, 0.5, False), _row("bn", {"lr": 0.1}, 0.7, True),
             _row("bn", {"lr": 0.03}, 0.6, False)]
    (tuned,) = tuned_norms(table)
    assert tuned.edges == [("lr", 0.1, "largest")]
    assert len(edge_warnings(table)) == 1 and "lr=0.1" in edge_warnings(table)[0]


def test_text_and_mixed_values_of_a_programs_own_key_have_no_edge_and_do_not_crash():
    """Free keys reach the program as typed, so one grid may hold "010" beside 7 (no order to speak of)."""
    table = [_row("bn", {"width": "010"}, 0.5, False), _row("bn", {"width": 7}, 0.7, True),
             _row("bn", {"opt": "adam"}, 0.6, False)]
    assert [t.edges for t in tuned_norms(table)] == [[]]
    assert edge_warnings(table) == []
