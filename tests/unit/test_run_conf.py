from __future__ import annotations

import pytest

from kvfleet.errors import PermanentError


def test_unknown_conf_keys_are_refused_naming_the_known_ones() -> None:
    from kvfleet.airflow.params import rollout_params
    from kvfleet.airflow.request import refuse_unknown_conf

    params = {k: p.value for k, p in rollout_params().items()}
    refuse_unknown_conf(params)  # every Param is known
    refuse_unknown_conf({**params, "aws_conn_id": "aws_prod"})
    with pytest.raises(PermanentError) as err:
        refuse_unknown_conf({**params, "foo": 1, "wave_szie": 2})
    text = str(err.value)
    assert "'foo'" in text and "'wave_szie'" in text and "wave_size" in text and "nothing was changed" in text
