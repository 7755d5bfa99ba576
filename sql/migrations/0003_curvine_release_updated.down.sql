ALTER TABLE curvine_releases DROP COLUMN helm_updated;
