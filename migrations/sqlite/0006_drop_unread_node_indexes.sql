-- No query reads nodes by session or by parent: every read is by id (a path walks parent links
-- upward by primary key). Nodes are never deleted, so the foreign keys need no child index
-- either. Each of these indexes cost every append a page write, one of them at a random place.
DROP INDEX nodes_session;
DROP INDEX nodes_parent;
