// Type-checked (never run) as a CommonJS consumer.
import idempo = require('idempo');

const fp: string = idempo.fingerprint({ method: 'POST', route: '/p', body: Buffer.from('{}') });
const e: idempo.IdempoError = new idempo.StoreUnavailableError('down');
const code: idempo.IdempoErrorCode = e.code;
void [fp, code];
