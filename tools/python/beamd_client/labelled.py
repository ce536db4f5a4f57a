"""Results as labelled arrays: an xarray.DataArray whose dims are the
descriptor's axes and whose coords are its labels. Needs xarray (Debian
python3-xarray); the rest of beamd_client does not.
"""


def _xarray():
    try:
        import xarray
    except ImportError as e:
        raise ImportError("beamd_client.to_xarray needs xarray (Debian: apt-get install "
                          "python3-xarray)") from e
    return xarray


def to_xarray(result):
    """The Result's array as an xarray.DataArray: dims from the descriptor's
    `axes` (dim_0, dim_1, ... where it names none or not all), coords from
    its `labels` where their length fits, name the topic, attrs the units,
    series_id, frame_id, partial, final."""
    xr = _xarray()
    a = result.array
    axes = result.axes
    dims = [axes[i] if i < len(axes) and axes[i] else "dim_%d" % i for i in range(a.ndim)]
    coords = {}
    for i, d in enumerate(dims):
        lab = result.labels(d) if i < len(axes) else None
        if lab is not None and len(lab) == a.shape[i]:
            coords[d] = list(lab)
    return xr.DataArray(a, dims=dims, coords=coords, name=result.topic,
                        attrs={"units": result.units, "series_id": result.series_id,
                               "frame_id": result.frame_id, "partial": result.partial,
                               "final": result.final})
