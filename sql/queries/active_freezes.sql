-- The freezes in force now (`kvfleet freeze list`, the kvfleet page's Fleet view), oldest first: what, who, when, why.
SELECT id, kind, scope, target, reason, requested_by, requested_at
FROM holds
WHERE kind = 'freeze' AND lifted_at IS NULL
ORDER BY requested_at, id
