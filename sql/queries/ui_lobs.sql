-- Every line of business the history knows: the kvfleet page assigns LOB colours in this order.
-- Each table's distinct LOBs are walked through its LOB index one LOB at a time (a loose index scan).
WITH RECURSIVE hv AS (
    (SELECT lob FROM hit_verifications WHERE lob IS NOT NULL ORDER BY lob LIMIT 1)
    UNION ALL
    SELECT (SELECT x.lob FROM hit_verifications x WHERE x.lob > hv.lob ORDER BY x.lob LIMIT 1)
    FROM hv WHERE hv.lob IS NOT NULL
), df AS (
    (SELECT lob FROM drift_findings WHERE lob IS NOT NULL ORDER BY lob LIMIT 1)
    UNION ALL
    SELECT (SELECT x.lob FROM drift_findings x WHERE x.lob > df.lob ORDER BY x.lob LIMIT 1)
    FROM df WHERE df.lob IS NOT NULL
), se AS (
    (SELECT lob FROM step_events WHERE lob IS NOT NULL AND stage = 'endpoint' ORDER BY lob LIMIT 1)
    UNION ALL
    SELECT (SELECT x.lob FROM step_events x WHERE x.lob > se.lob AND x.stage = 'endpoint' ORDER BY x.lob LIMIT 1)
    FROM se WHERE se.lob IS NOT NULL
)
SELECT lob FROM hv WHERE lob IS NOT NULL
UNION
SELECT lob FROM df WHERE lob IS NOT NULL
UNION
SELECT lob FROM se WHERE lob IS NOT NULL
ORDER BY lob
