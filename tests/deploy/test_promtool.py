"""promtool on what Prometheus reads: the rules file and its unit tests, and the exporter's exposition."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest

from stream_ndcg.comparisons import ALPHA, N_STAR, against_control, plain_difference
from tests.support.deploy import CHART, DEPLOY, helm, promtool, rules
from tests.support.exporter import T0, build, event, feed

pytestmark = pytest.mark.deploy


def test_rules_pass_promtool_check() -> None:
    result = subprocess.run([promtool(), "check", "rules", "rules.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_promtool_unit_test_and_they_pass() -> None:
    alerts = {r["alert"] for r in rules() if "alert" in r}
    tests = yaml.safe_load((DEPLOY / "prometheus" / "tests" / "rules_test.yml").read_text())
    fired = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if a["exp_alerts"]}
    quiet = {a["alertname"] for t in tests["tests"] for a in t.get("alert_rule_test", []) if not a["exp_alerts"]}
    assert alerts == fired, f"alerts without a firing test: {alerts - fired}"
    assert alerts == quiet, f"alerts without a test that they stay quiet: {alerts - quiet}"
    result = subprocess.run([promtool(), "test", "rules", "tests/rules_test.yml"], cwd=DEPLOY / "prometheus",
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_scrape_passes_promtool_check_metrics() -> None:
    store, engine, registry = build(("variant", "engine"))
    feed(store, engine, [
        event(type="impression", impression_id="i", query_id="q", ts=T0, results=["a", "b"],
              segment={"variant": "A", "engine": "web"}),
        event(type="judgment", query_id="q", doc_id="a", grade=2, ts=T0),
    ])
    result = subprocess.run([promtool(), "check", "metrics"], input=generate_latest(registry),
                            capture_output=True, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr).decode()
    assert not result.stdout.strip() and not result.stderr.strip(), (result.stdout + result.stderr).decode()


# The comparison rules' series, and the field of `comparisons.Comparison` each must equal.
COMPARED = {"stream_ndcg:ndcg:difference_from_control": "difference",
            "stream_ndcg:ndcg:difference_from_control_standard_error": "standard_error",
            "stream_ndcg:ndcg:difference_from_control_low": "low",
            "stream_ndcg:ndcg:difference_from_control_high": "high"}


def arm_sums(rng: random.Random, impressions: int, shift: float) -> tuple[int, float, float]:
    """An arm's (n, sum, sum of squares) over per-impression nDCGs drawn around a query mix."""
    values = [min(1.0, max(0.0, rng.betavariate(2.0, 1.5) + shift)) for _ in range(impressions)]
    return impressions, sum(values), sum(v * v for v in values)


def series(pipeline: str, variant: str, engine: str, sums: tuple[int, float, float]) -> list[dict[str, str]]:
    """What the exporter exports of one arm and engine, every sum as Python writes the float."""
    n, total, squares = sums
    quality = f'pipeline="{pipeline}", k="10", window="1h", variant="{variant}", engine="{engine}"'
    counts = f'pipeline="{pipeline}", window="1h", variant="{variant}", engine="{engine}"'
    return [{"series": f"{name}{{{labels}}}", "values": f"{value!r}x5"} for name, labels, value in (
        ("stream_ndcg_ndcg_numerator", quality, total), ("stream_ndcg_scored_impressions", quality, n),
        ("stream_ndcg_ndcg_squares", quality, squares), ("stream_ndcg_impressions", counts, n),
        ("stream_ndcg_squared_impressions", counts, n))]


@pytest.mark.parametrize("overrides", [{}, {"alerts.alpha": "0.01", "alerts.nStar": "2500"}])
def test_the_rules_interval_is_the_comparisons_modules(overrides: dict[str, str], tmp_path: Path) -> None:
    """The recording rules' difference, standard error and always-valid interval against the control
    equal `comparisons.against_control` on the same sums to 1e-9, with two arms and with three
    (Bonferroni), at the default alpha and N* and at others from the chart's values."""
    rule_file = DEPLOY / "prometheus" / "rules.yml"
    if overrides:
        rendered = helm("template", "stream-ndcg", str(CHART), "-f", str(DEPLOY / "compose-values.yaml"),
                        "--show-only", "templates/prometheusrule.yaml",
                        *[f"--set={key}={value}" for key, value in overrides.items()])
        assert rendered.returncode == 0, rendered.stderr
        rule_file = tmp_path / "rules.yml"
        rule_file.write_text(yaml.safe_dump(yaml.safe_load(rendered.stdout)["spec"]))
    alpha, n_star = float(overrides.get("alerts.alpha", ALPHA)), float(overrides.get("alerts.nStar", N_STAR))
    rng = random.Random(29)
    inputs: list[dict[str, str]] = []
    checks = []
    for pipeline, shifts in {"two": {"A": 0.0, "B": -0.03}, "three": {"A": 0.0, "B": -0.02, "C": 0.01}}.items():
        # The control's impressions come from two engines, which the rules add up.
        engines = {variant: [arm_sums(rng, rng.randint(200, 900), shift) for _ in range(2 if variant == "A" else 1)]
                   for variant, shift in shifts.items()}
        arms: dict[str, tuple[float, float, float]] = {
            variant: (sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts))
            for variant, parts in engines.items()}
        for variant, parts in engines.items():
            for engine, part in zip(("web", "app"), parts, strict=False):
                inputs += series(pipeline, variant, engine, part)
        for variant, comparison in against_control(arms, "A", plain_difference, alpha, n_star).items():
            assert comparison is not None
            labels = f'pipeline="{pipeline}", k="10", window="1h", variant="{variant}"'
            for name, field in COMPARED.items():
                expected = getattr(comparison, field)
                checks.append({"expr": f"abs({name}{{{labels}}} / ({expected!r}) - 1) < bool 1e-9", "eval_time": "2m",
                               "exp_samples": [{"labels": f"{{{labels}}}", "value": 1}]})
    tests = {"rule_files": [str(rule_file)], "evaluation_interval": "1m",
             "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": checks}]}
    (tmp_path / "comparisons_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = subprocess.run([promtool(), "test", "rules", "comparisons_test.yml"], cwd=tmp_path,
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
