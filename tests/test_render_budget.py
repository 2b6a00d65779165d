"""RenderBudget: the server's render capacity, shared by sessions of engines of different speeds."""
import pytest

from newsstudio.render_budget import RenderBudget


def test_a_budget_admits_sessions_while_their_frame_rates_fit_and_counts_engines_against_one_gpu():
    b = RenderBudget.parse("musetalk=420,ditto=240")
    assert b.cost("musetalk", 30) == pytest.approx(30 / 420) and b.cost("ditto", 30) == pytest.approx(0.125)
    assert b.cost("classic", 30) == 0.0  # not named, no "*": not budgeted
    load = 0.0
    for _ in range(14):  # 14 MuseTalk sessions at 30 fps fill 420 frames/s exactly
        load += b.check("musetalk", 30, load)
    assert load == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"render capacity full: live sessions use 100%, a 30 fps musetalk session needs 7%"):
        b.check("musetalk", 30, load)
    # half the GPU on MuseTalk leaves room for half of Ditto's capacity, not all of it
    load = sum(b.check("musetalk", 30, 30 * k / 420) for k in range(7))
    assert load == pytest.approx(0.5)
    for _ in range(4):
        load += b.check("ditto", 30, load)
    with pytest.raises(ValueError):
        b.check("ditto", 30, load)
    with pytest.raises(ValueError, match="needs more than this server renders"):
        RenderBudget.parse("50").check("classic", 60, 0.0)
    ntsc = RenderBudget.parse("59.94")  # two 30000/1001 fps sessions fill it (59.94006 frames/s)
    assert ntsc.check("classic", 30000 / 1001, ntsc.cost("classic", 30000 / 1001)) == pytest.approx(0.5, rel=1e-5)


@pytest.mark.parametrize("spec,expected", [
    ("420", {"*": 420.0}), (420, {"*": 420.0}), ("musetalk=420, ditto=240", {"musetalk": 420.0, "ditto": 240.0}),
    ("musetalk=420,*=1000", {"musetalk": 420.0, "*": 1000.0}),
])
def test_budget_specs(spec, expected):
    assert dict(RenderBudget.parse(spec).fps_by_engine) == expected


@pytest.mark.parametrize("spec,message", [
    ("", "empty"), ("fast", "is not N or ENGINE=N"), ("musetalk=", "is not N or ENGINE=N"), ("=420", "is not N or ENGINE=N"),
    ("musetalk=420,musetalk=400", "given twice"), ("0", "must be > 0"), ("ditto=-5", "must be > 0"), ("nan", "must be > 0"),
])
def test_malformed_budget_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError, match=message):
        RenderBudget.parse(spec)


def test_a_budget_naming_an_engine_the_server_does_not_have_is_refused():
    engines = ("classic", "musetalk", "ditto")
    with pytest.raises(ValueError, match=r"unknown engine 'musetlak' \(engines: classic, ditto, musetalk\)"):
        RenderBudget.parse("musetlak=420", engines)
    assert RenderBudget.parse("musetalk=420,*=900", engines).capacity("ditto") == 900
