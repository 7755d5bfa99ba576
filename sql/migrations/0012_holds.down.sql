-- kvfleet history schema: undo revision 0012 (freezes and emergency stops). Their record stays in audit_log.
DROP TABLE IF EXISTS holds;
