"""Images written as an image folder, in the layouts ``--dataset=folder:ROOT`` reads."""


def write_folder(root, images, labels, names, split, first=0):
    """``images`` as PNGs in ``root/split/<class name>/``, numbered from ``first`` in the order
    given."""
    from PIL import Image

    for i, (image, label) in enumerate(zip(images, labels), start=first):
        folder = root / split / names[label]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image.squeeze(-1) if image.shape[-1] == 1 else image).save(
            folder / f"{i:05d}.png")
