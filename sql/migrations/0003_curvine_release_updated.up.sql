-- kvfleet history schema, revision 0003. Helm revisions are immutable once written, so stage 3 reads a
-- revision's values once and afterwards only refreshes its status. A revision number is only reused after
-- `helm uninstall` and a new install; helm's "updated" time of the revision tells the two apart.
ALTER TABLE curvine_releases ADD COLUMN helm_updated text;
