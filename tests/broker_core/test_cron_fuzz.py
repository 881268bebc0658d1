"""Fuzzing AMQ_SCHEDULED_CRON: any text is either refused with InvalidMessage naming the header, or accepted
with a next time (computed by the real Redis, includes/cron.lua) that a minute-by-minute search agrees with,
from any time."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker_core.cron import parse
from broker_core.errors import InvalidMessage

from .test_cron import brute_next, lua_next

ITEMS = ["*", "?", "0", "1", "2", "5", "7", "12", "15", "23", "24", "28", "29", "30", "31", "32", "59", "60",
         "6", "99", "", "-", "/", ",", "*/", "/0", "/2", "/7", "/13", "a", "\t", " "]
FIELD = st.lists(st.sampled_from(ITEMS), min_size=1, max_size=5).map("".join)
EXPRESSIONS = st.one_of(
    st.lists(FIELD, min_size=5, max_size=5).map(" ".join),
    st.lists(FIELD, min_size=0, max_size=7).map(" ".join),
    st.text(alphabet="0123456789*?/,- \t\n\u00a0x", max_size=40),
)
# 1970 to 2200, the ends of months and of leap years included by chance
AFTER = st.integers(0, 7_258_118_400_000)

FUZZ_EXAMPLES = int(os.environ.get("CRON_FUZZ_EXAMPLES", "400"))  # raise it for a longer hunt
SETTINGS = settings(max_examples=FUZZ_EXAMPLES, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(expression=EXPRESSIONS, after=AFTER)
def test_any_text_is_refused_by_name_or_fires_when_cron_says(redis_client, expression, after):
    try:
        form = parse(expression)
    except InvalidMessage as exc:
        assert "AMQ_SCHEDULED_CRON" in str(exc) and exc.details == {"field": "cron"}
        return
    (lua,) = lua_next(redis_client, [(form, after)])
    assert lua is not None, expression  # an accepted expression always has a next time
    expected = brute_next(expression, after, 367)
    if expected is None:  # (a rare date: later than the brute search looks, within the 8 years)
        assert after + 366 * 86_400_000 < lua <= after + 8 * 366 * 86_400_000 + 86_400_000, expression
    else:
        assert lua == expected, (expression, after)
