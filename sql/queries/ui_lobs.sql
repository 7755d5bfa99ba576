-- Every line of business the history knows: the kvfleet page assigns LOB colours in this order.
SELECT lob FROM hit_verifications WHERE lob IS NOT NULL
UNION
SELECT lob FROM drift_findings WHERE lob IS NOT NULL
UNION
SELECT lob FROM step_events WHERE lob IS NOT NULL AND stage = 'endpoint'
ORDER BY lob
