-- The roles `outbox grants` gave rights on {table} before its upgrade to the split layout get
-- the rights of the same role on the split tables, in the upgrade's transaction: an enqueue or
-- a worker of the new version never finds the queue table closed to it. Found by the rights
-- the earlier grants gave and the upgrade keeps: an enqueuer may INSERT the payload, a worker
-- may DELETE events (explicit grants only: not the owner, not PUBLIC).
DO $upgrade_grants$
DECLARE
    grantee text;
BEGIN
    FOR grantee IN
        SELECT DISTINCT r.rolname
        FROM pg_class AS c
        JOIN pg_attribute AS a ON a.attrelid = c.oid AND a.attname = 'payload'
        CROSS JOIN LATERAL (SELECT * FROM aclexplode(a.attacl)
                            UNION ALL
                            SELECT * FROM aclexplode(c.relacl)) AS acl
        JOIN pg_roles AS r ON r.oid = acl.grantee
        WHERE c.oid = '{table}'::regclass AND acl.privilege_type = 'INSERT' AND r.oid <> c.relowner
        ORDER BY 1
    LOOP
        EXECUTE replace($grants${enqueuer_grants}$grants$, '{enqueuer}', quote_ident(grantee));
    END LOOP;
    FOR grantee IN
        SELECT DISTINCT r.rolname
        FROM pg_class AS c
        CROSS JOIN LATERAL aclexplode(c.relacl) AS acl
        JOIN pg_roles AS r ON r.oid = acl.grantee
        WHERE c.oid = '{table}'::regclass AND acl.privilege_type = 'DELETE' AND r.oid <> c.relowner
        ORDER BY 1
    LOOP
        EXECUTE replace($grants${worker_grants}$grants$, '{worker}', quote_ident(grantee));
    END LOOP;
END
$upgrade_grants$;
