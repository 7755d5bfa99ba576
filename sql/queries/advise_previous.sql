-- The L2 advisor's previous observation of each endpoint of one cluster (kvfleet.stages.advise
-- .previous_observations): from the `advise:<cluster>` steps since :cutoff that observed it, the endpoint's
-- `observation` ({"at": wall time, "pods": {pod uid: request counter}}); the next report's request rate is the
-- counters' increase since then (Prometheus rate()). A run scoped to some endpoints observes only those.
-- The newest recorded at or before :latest (now minus the advisor's minimum interval) is preferred: a closer one
-- would extrapolate a burst. Without one, the newest (too close) is returned, so the advisor can say why it did
-- not use it.
SELECT DISTINCT ON (e ->> 'endpoint') e ->> 'endpoint' AS endpoint, e -> 'observation' AS observation, s.at
FROM step_events s
CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(s.detail -> 'endpoints') = 'array'
                                             THEN s.detail -> 'endpoints' ELSE '[]'::jsonb END) AS e
WHERE s.stage = 'advise' AND s.step LIKE 'advise:%' AND s.cluster = ANY(:clusters) AND s.at >= :cutoff
  AND jsonb_typeof(e -> 'observation') = 'object'
ORDER BY e ->> 'endpoint', s.at <= :latest DESC, s.at DESC, s.id DESC
