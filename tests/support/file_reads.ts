// Counts the bytes read through Deno.FsFile's `read` while `f` runs (the checkpoint's range reads go through
// it), restoring the method after, however `f` ends.

/** `f`'s result and the bytes FsFile.read returned while it ran. */
export async function countFileReads<T>(f: () => Promise<T>): Promise<{ result: T; bytes: number }> {
  const proto = Deno.FsFile.prototype;
  const original = proto.read;
  let bytes = 0;
  proto.read = async function (this: Deno.FsFile, p: Uint8Array) {
    const n = await original.call(this, p);
    bytes += n ?? 0;
    return n;
  };
  try {
    return { result: await f(), bytes };
  } finally {
    proto.read = original;
  }
}
