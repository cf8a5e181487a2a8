-- Content blobs may be stored compressed: 0 = raw bytes, 1 = zstd. `size` stays the raw size.
ALTER TABLE blobs ADD COLUMN codec INTEGER NOT NULL DEFAULT 0;

-- A long node body (tool-call arguments, function input and output) is stored zstd-compressed
-- in `body_z`, with `body` left empty.
ALTER TABLE nodes ADD COLUMN body_z BLOB;
