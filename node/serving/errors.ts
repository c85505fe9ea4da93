// Errors as OpenAI's API reports them: an HTTP status and the body
// `{"error": {"message", "type", "param", "code"}}`, which the official clients turn into their typed
// exceptions (BadRequestError, AuthenticationError, NotFoundError, RateLimitError, ...). A route throws an
// ApiError; the app's error handler writes it (anything else becomes a 500 with its message).

export type ErrorType = "invalid_request_error" | "rate_limit_error" | "server_error";

export interface ErrorBody {
  error: { message: string; type: ErrorType; param: string | null; code: string | null };
}

export class ApiError extends Error {
  override name = "ApiError";
  constructor(
    readonly status: 400 | 401 | 403 | 404 | 413 | 429 | 500 | 503,
    message: string,
    readonly opts: { type?: ErrorType; param?: string | null; code?: string | null; retryAfterS?: number } =
      {},
  ) {
    super(message);
  }

  get body(): ErrorBody {
    const type = this.opts.type ??
      (this.status === 429
        ? "rate_limit_error"
        : this.status >= 500
        ? "server_error"
        : "invalid_request_error");
    return {
      error: { message: this.message, type, param: this.opts.param ?? null, code: this.opts.code ?? null },
    };
  }

  /** The error as a response (with Retry-After for 429 / 503 when known). */
  response(): Response {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.opts.retryAfterS !== undefined) headers["retry-after"] = String(this.opts.retryAfterS);
    return new Response(JSON.stringify(this.body), { status: this.status, headers });
  }
}

/** 400 for a field that is wrong: `param` names it. */
export function badRequest(
  message: string,
  param: string | null = null,
  code: string | null = null,
): ApiError {
  return new ApiError(400, message, { param, code });
}
