export { idempotency, idempotencyErrorHandler, keepRawBody, readBody } from './express';
export type { IdempotencyMiddleware } from './express';
export { idempotencyPlugin } from './fastify';
export type { FastifyIdempotencyOptions } from './fastify';
export type { IdempotencyOptions } from './options';
export { IdempotencyEvents, Session } from './session';
export type { ExecutionContext, HandlerResult, HttpResponse, IdempotencyEventMap, FlowEnd } from './session';
export { currentTransaction } from './tx';
