// The one error a model directory's contents can raise: callers (main.ts) map it to exit code 2,
// because it always means bad input on disk, never a bug or a runtime failure.

/**
 * Bad input in a model directory: a missing directory or file, a bad safetensors header, a truncated
 * file, a missing or wrongly shaped tensor, an unsupported dtype or architecture, a bad config.json.
 * The message names the file or tensor, what was found and what was expected.
 */
export class CheckpointError extends Error {
  override name = "CheckpointError";
}

/**
 * A request the model cannot serve as asked: token ids outside the vocabulary, more positions than the
 * model has, a weight storage this GPU lacks, a layer range outside the model. Bad input like
 * CheckpointError (the CLI exits 2, HTTP answers 400); the message says what was asked and what is possible.
 */
export class RequestError extends Error {
  override name = "RequestError";
}
