/* The NXmx fields the record stage writes (daemon/nxmx_write.c), read back
 * with beamd-replay's own readers (daemon/nxmx.c: units converted by each
 * dataset's "units" attribute): every value of a full DECTRIS-like series
 * comes back as it went in; the pixel mask, converted to uint32 from
 * another dtype, keeps its bad pixels; a series that says nothing gets the
 * NXmx skeleton and no invented value; energy from the DECTRIS wavelength
 * when there is no energy. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "tests/common/runner.h"

#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/h5util.h"
#include "daemon/nxmx.h"
#include "daemon/nxmx_write.h"
#include "tests/common/stage_harness.h"

static int never_bad(void *ctx, const char *path, int code, const char *units) {
  fail_msg("%s: code %d, units \"%s\"", path, code, units);
  return -1;
}

/* A file with /entry, written from series s; open for reading. */
static hid_t write_and_open(const beam_series_t *s, beam_dtype_t dt, const char *name) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", bh_tmpdir(), name);
  hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  assert_true(f >= 0);
  hid_t e = beam_h5_group(f, "/entry", "NXentry");
  assert_true(e >= 0);
  H5Gclose(e);
  assert_int_equal(beam_nx_write_series(f, s, dt), 0);
  H5Fclose(f);
  f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
  assert_true(f >= 0);
  return f;
}

static double get(hid_t f, const char *path, beam_nx_kind_t k) {
  double v = NAN;
  assert_int_equal(beam_nx_get(f, path, k, 1, &v, never_bad, NULL), 1);
  return v;
}

static void units_are(hid_t f, const char *path, const char *want) {
  hid_t ds = H5Dopen2(f, path, H5P_DEFAULT);
  assert_true(ds >= 0);
  char u[32];
  assert_int_equal(beam_nx_units(ds, u, sizeof u), 0);
  assert_string_equal(u, want);
  H5Dclose(ds);
}

static void test_full_series(void **state) {
  const char *meta =
      "{\"detector\":\"EIGER2 X 4M\",\"frame_time\":0.002,\"nframes\":9,\"energy\":8048.5,"
      "\"wavelength\":1.5,\"distance\":0.2875,\"count_time\":0.00199,"
      "\"pixel_size\":[7.6e-05,7.5e-05],\"beam_center\":[1021.25,1037.5],"
      "\"dectris\":{\"saturation_value\":4095,\"config\":{\"bit_depth_readout\":12}}}";
  uint32_t shp[2] = {3, 4};
  beam_series_t *s = beam_series_new(2, BEAM_DT_U16, 2, shp, meta, strlen(meta));
  uint8_t mask[12] = {0, 1, 0, 0, 0, 0, 4, 0, 0, 0, 0, 255};
  assert_int_equal(beam_series_add_array(s, "pixel_mask", BEAM_DT_U8, 2, shp, mask, sizeof mask), 0);
  hid_t f = write_and_open(s, BEAM_DT_U16, "full.h5");
  double v;
  assert_int_equal(beam_nx_energy(f, &v, never_bad, NULL), 1);
  assert_true(v == 8048.5); /* incident_energy, exact; the wavelength is also there */
  assert_int_equal(beam_nx_distance(f, &v, never_bad, NULL), 1);
  assert_true(v == 0.2875);
  assert_true(get(f, BEAM_NX_DET "x_pixel_size", BEAM_NX_LENGTH) == 7.5e-05);
  assert_true(get(f, BEAM_NX_DET "y_pixel_size", BEAM_NX_LENGTH) == 7.6e-05);
  assert_true(get(f, BEAM_NX_DET "beam_center_x", BEAM_NX_PIXELS) == 1037.5);
  assert_true(get(f, BEAM_NX_DET "beam_center_y", BEAM_NX_PIXELS) == 1021.25);
  assert_true(get(f, BEAM_NX_DET "frame_time", BEAM_NX_TIME) == 0.002);
  assert_true(get(f, BEAM_NX_DET "count_time", BEAM_NX_TIME) == 0.00199);
  double wl = get(f, BEAM_NX_BEAM "incident_wavelength", BEAM_NX_LENGTH);
  assert_true(fabs(wl * 8048.5 / BEAM_NX_HC_EV_M - 1) < 1e-15);
  units_are(f, BEAM_NX_BEAM "incident_wavelength", "angstrom");
  units_are(f, BEAM_NX_BEAM "incident_energy", "eV");
  units_are(f, BEAM_NX_DET "detector_distance", "m");
  units_are(f, BEAM_NX_DET "beam_center_x", "pixel");
  units_are(f, BEAM_NX_DET "frame_time", "s");
  assert_true(get(f, BEAM_NX_DET "saturation_value", BEAM_NX_PIXELS) == 4095);
  assert_true(get(f, BEAM_NX_DET "bit_depth_readout", BEAM_NX_PIXELS) == 12);
  hid_t ds = H5Dopen2(f, BEAM_NX_DET "pixel_mask", H5P_DEFAULT);
  assert_true(ds >= 0);
  hid_t t = H5Dget_type(ds);
  assert_true(H5Tequal(t, H5T_STD_U32LE) > 0);
  H5Tclose(t);
  uint32_t got[12];
  assert_true(H5Dread(ds, H5T_NATIVE_UINT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, got) >= 0);
  for (int i = 0; i < 12; i++)
    assert_int_equal(got[i], mask[i]);
  H5Dclose(ds);
  char desc[64] = "";
  ds = H5Dopen2(f, "/entry/definition", H5P_DEFAULT);
  t = H5Dget_type(ds);
  assert_true(H5Dread(ds, t, H5S_ALL, H5S_ALL, H5P_DEFAULT, desc) >= 0);
  assert_string_equal(desc, "NXmx");
  H5Tclose(t);
  H5Dclose(ds);
  H5Fclose(f);
  beam_series_unref(&s);
}

static void test_nothing_known(void **state) {
  uint32_t shp[2] = {2, 2};
  beam_series_t *s = beam_series_new(3, BEAM_DT_F32, 2, shp, NULL, 0);
  hid_t f = write_and_open(s, BEAM_DT_F32, "bare.h5");
  double v;
  assert_int_equal(beam_nx_energy(f, &v, never_bad, NULL), 0);
  assert_int_equal(beam_nx_distance(f, &v, never_bad, NULL), 0);
  const char *absent[] = {"x_pixel_size", "beam_center_x", "frame_time", "count_time",
                          "pixel_mask", "description", "bit_depth_readout", "saturation_value"};
  for (size_t i = 0; i < sizeof absent / sizeof *absent; i++) {
    char p[128];
    snprintf(p, sizeof p, BEAM_NX_DET "%s", absent[i]);
    assert_false(beam_h5_exists(f, p));
  }
  assert_true(beam_h5_exists(f, "/entry/definition"));
  assert_true(beam_h5_exists(f, BEAM_NX_BEAM));
  H5Fclose(f);
  beam_series_unref(&s);
  /* Energy only as the DECTRIS wavelength (angstrom); a frame time of 0
   * (unknown) is left out; a scalar pixel size gives x and y. */
  const char *meta = "{\"frame_time\":0,\"wavelength\":1.0,\"pixel_size\":5.5e-05}";
  s = beam_series_new(4, BEAM_DT_U32, 2, shp, meta, strlen(meta));
  f = write_and_open(s, BEAM_DT_U32, "wl.h5");
  assert_int_equal(beam_nx_energy(f, &v, never_bad, NULL), 1);
  assert_true(fabs(v / (BEAM_NX_HC_EV_M * 1e10) - 1) < 1e-15);
  assert_false(beam_h5_exists(f, BEAM_NX_DET "frame_time"));
  assert_true(get(f, BEAM_NX_DET "x_pixel_size", BEAM_NX_LENGTH) == 5.5e-05);
  assert_true(get(f, BEAM_NX_DET "y_pixel_size", BEAM_NX_LENGTH) == 5.5e-05);
  assert_true(get(f, BEAM_NX_DET "bit_depth_readout", BEAM_NX_PIXELS) == 32); /* the dtype's */
  H5Fclose(f);
  beam_series_unref(&s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_full_series),
      cmocka_unit_test(test_nothing_known),
  };
  return beam_run_tests(tests, NULL, NULL);
}
