// The README's body-parser example (see server.mts).
// ---- README ----
import express from 'express';
import { idempotency, keepRawBody, MemoryStore } from 'idempo';

const app = express();
// Parsers before the middleware keep the raw bytes for the fingerprint with keepRawBody ...
app.use(express.json({ verify: keepRawBody }), express.urlencoded({ extended: false, verify: keepRawBody }));
app.post('/payments', idempotency({ store: new MemoryStore(), public: true }), (req, res) => {
  res.status(201).json({ amount: req.body.amount });
});
// ... parsers after it need nothing: they parse the bytes the middleware read.
const api = express.Router();
api.use(idempotency({ store: new MemoryStore(), public: true, methods: ['POST', 'PATCH', 'PUT'] }));
api.use(express.text());
api.put('/notes/:id', (req, res) => {
  res.json({ id: req.params.id, text: String(req.body) });
});
app.use('/api', api);
