DROP TABLE IF EXISTS drift_watches;
