"""An independent numpy difference-map reference: the algorithm in
pipeline/ptycho/dm.h, written from its formulas (not from the C).

Shapes: amp (N, n, n) float, FFT order, < 0 masked; pos (N, 2) int (row,
col); probe (M_P, n, n) complex; obj (M_O, H, W) complex. All arithmetic in
complex128 / float64, loops over views kept plain on purpose.
"""
import numpy as np

EPS = 1e-10  # dm.h's eps in the modulus step (BEAM_DM_EPS)


def fft2(x):
    return np.fft.fft2(x, norm="ortho")


def ifft2(x):
    return np.fft.ifft2(x, norm="ortho")


class DM:
    def __init__(self, amp, pos, probe, obj, beta=1.0, obj_reg=1e-3, probe_reg=1e-3,
                 probe_update_start=2, inner_passes=1, fourier_relax=0.0, probe_support=0.0,
                 algorithm="dm"):
        self.amp = np.asarray(amp, dtype=np.float64)
        self.pos = np.asarray(pos, dtype=np.int64)
        self.P = np.array(probe, dtype=np.complex128)
        self.O = np.array(obj, dtype=np.complex128)
        self.beta = beta
        # psi <- psi + b X + a phi - (a + b) psi: DM (-beta, beta), RAAR (1 - 2 beta, beta)
        self.a = -beta if algorithm == "dm" else 1.0 - 2.0 * beta
        self.b = beta
        self.obj_reg = obj_reg
        self.probe_reg = probe_reg
        self.probe_update_start = probe_update_start
        self.inner_passes = inner_passes
        self.fourier_relax = fourier_relax
        self.probe_support = probe_support
        self.n = self.amp.shape[1]
        self.it = 0
        # exit waves psi[i, j, k] start as P_j W_i O_k
        self.psi = np.array([self.phi(i) for i in range(len(self.pos))])

    def window(self, k, i):
        r, c = self.pos[i]
        return self.O[k, r:r + self.n, c:c + self.n]

    def phi(self, i):
        MP, MO = self.P.shape[0], self.O.shape[0]
        return np.array([[self.P[j] * self.window(k, i) for k in range(MO)] for j in range(MP)])

    def iterate(self):
        n = self.n
        valid_all = self.amp >= 0
        a2 = np.array([np.sum(np.where(v, a, 0.0) ** 2) for a, v in zip(self.amp, valid_all)])
        pbound = None
        if self.fourier_relax > 0:
            pbound = 0.25 * self.fourier_relax ** 2 * a2.max() / n ** 2
        err_sum = 0.0
        a2_sum = 0.0
        for i in range(len(self.pos)):
            A = self.amp[i]
            valid = valid_all[i]
            ph = self.phi(i)
            if np.sum(A[valid]) == 0:
                self.psi[i] = ph  # no photons: no information
                continue
            Phi = fft2(2 * ph - self.psi[i])
            af = np.sqrt(np.sum(np.abs(Phi) ** 2, axis=(0, 1)))
            fdev = af - A
            e = np.sum(fdev[valid] ** 2)
            err_sum += e
            a2_sum += np.sum(A[valid] ** 2)
            if pbound is None:
                f = np.where(valid, A / (af + EPS), 1.0)
            else:
                err_i = e / np.count_nonzero(valid)
                if err_i > pbound:
                    f = np.where(valid, (A + fdev * np.sqrt(pbound / err_i)) / (af + EPS), 1.0)
                else:
                    f = np.ones_like(af)
            X = ifft2(Phi * f)
            self.psi[i] = self.psi[i] + self.b * X + self.a * ph - (self.a + self.b) * self.psi[i]

        O_prev, P_prev = self.O.copy(), self.P.copy()
        update_probe = self.it >= self.probe_update_start
        for _ in range(self.inner_passes):
            self.update_object()
            if update_probe:
                self.update_probe()
        self.it += 1
        fe = err_sum / a2_sum if a2_sum > 0 else 0.0
        oc = np.linalg.norm(self.O - O_prev) / np.linalg.norm(self.O)
        pc = np.linalg.norm(self.P - P_prev) / np.linalg.norm(self.P) if update_probe else 0.0
        return fe, pc, oc

    def update_object(self):
        n = self.n
        MP, MO = self.P.shape[0], self.O.shape[0]
        num = np.zeros_like(self.O)
        den = np.zeros(self.O.shape[1:])
        for i, (r, c) in enumerate(self.pos):
            for j in range(MP):
                den[r:r + n, c:c + n] += np.abs(self.P[j]) ** 2
                for k in range(MO):
                    num[k, r:r + n, c:c + n] += np.conj(self.P[j]) * self.psi[i, j, k]
        a = self.obj_reg * den.max()
        d = den + a
        ok = d > 0
        for k in range(MO):
            self.O[k][ok] = (num[k][ok] + a * self.O[k][ok]) / d[ok]

    def update_probe(self):
        n = self.n
        MP, MO = self.P.shape[0], self.O.shape[0]
        num = np.zeros_like(self.P)
        den = np.zeros((n, n))
        for i in range(len(self.pos)):
            for k in range(MO):
                w = self.window(k, i)
                den += np.abs(w) ** 2
                for j in range(MP):
                    num[j] += self.psi[i, j, k] * np.conj(w)
        a = self.probe_reg * den.max()
        d = den + a
        ok = d > 0
        for j in range(MP):
            self.P[j][ok] = (num[j][ok] + a * self.P[j][ok]) / d[ok]
        if self.probe_support > 0:
            y, x = np.indices((n, n))
            r2 = (y - n // 2) ** 2 + (x - n // 2) ** 2
            self.P[:, np.pi * r2 >= self.probe_support * n * n] = 0


def rel_error(a, b):
    """min_c ||c a - b|| / ||b|| (global phase and scale removed)."""
    a = np.ravel(a)
    b = np.ravel(b)
    c = np.vdot(a, b) / np.vdot(a, a)
    return np.linalg.norm(c * a - b) / np.linalg.norm(b)
